//! One output layer for every tool. Tools hand over typed rows, stacks,
//! histograms and a summary; a `Printer` decides how they look.

mod folded;
pub mod frame;
mod json;
mod merge;
mod sink;
mod text;
mod value;

use std::io::Write;

pub use folded::{fold, FoldedPrinter};
pub use json::JsonPrinter;
pub use merge::{merge_stacks, MergedStacks, Merger};
pub use sink::{muted, to_stderr};
pub use text::{human, TextPrinter};
pub use value::{Col, Row, Value};

/// A symbolized frame as shown. Shared: the rows of thousands of exited
/// processes name the same few thousand frames, and a string per frame per
/// row was most of `faults --stacks`' heap under a churn (40 MB of 119).
pub type Shown = std::sync::Arc<str>;

/// One aggregated stack with its counts.
#[derive(Debug, Clone, Default)]
pub struct StackReport {
    pub pid: u32,
    pub comm: String,
    pub count: u64,
    /// Bytes attributed to the stack (heap growth for brk), if the tool has them.
    pub bytes: Option<u64>,
    /// Innermost first.
    pub user: Vec<Shown>,
    /// Innermost first.
    pub kernel: Vec<Shown>,
    /// Why a stack is missing, when it is ("capture failed", "not captured").
    pub note: Option<String>,
    /// Processes whose identical stacks were merged into this one (0 or 1:
    /// only `pid`).
    pub processes: usize,
    /// The other processes merged in, where known (exited processes' stacks
    /// kept by what they show): merging again counts each process once.
    pub pids: Vec<u32>,
    /// Allocation statistics (memleak): `count` and `bytes` are then what
    /// is outstanding.
    pub alloc: Option<AllocFigures>,
    /// The process's memory cgroup (path), where known; none once stacks
    /// of processes in different groups are merged.
    pub group: Option<String>,
}

/// What a stack row shows, the identity rows merge by: its process when
/// rows are kept per process (else 0), name, frames and note.
pub type ShownKey<'a> = (u32, &'a str, &'a [Shown], &'a [Shown], Option<&'a str>);

impl StackReport {
    /// Its `ShownKey`, with `pid` standing for its process.
    pub fn shown(&self, pid: u32) -> ShownKey<'_> {
        (
            pid,
            &self.comm,
            &self.user,
            &self.kernel,
            self.note.as_deref(),
        )
    }
}

/// Per stack: allocations made and freed, in number and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocFigures {
    pub allocs: u64,
    pub bytes: u64,
    pub frees: u64,
    pub freed_bytes: u64,
    /// Shown beside what is outstanding (`--all`).
    pub churn: bool,
    /// Scaled up from sampled allocations.
    pub estimated: bool,
    /// Reports are sorted by outstanding bytes (else by count).
    pub by_bytes: bool,
}

impl AllocFigures {
    /// Saturating: a record's counts are read from a file, and a sum that
    /// wrapped would show a small number for a huge one.
    pub fn add(&mut self, o: &AllocFigures) {
        self.allocs = self.allocs.saturating_add(o.allocs);
        self.bytes = self.bytes.saturating_add(o.bytes);
        self.frees = self.frees.saturating_add(o.frees);
        self.freed_bytes = self.freed_bytes.saturating_add(o.freed_bytes);
    }
}

/// What a report left out past its `--top`: shown plus this is what was
/// counted, so a cut is never silent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rest {
    /// What the items are ("stacks", "processes", "files"...).
    pub what: &'static str,
    pub items: u64,
    /// Events (allocations outstanding, for memleak) of the items left out.
    pub count: u64,
    pub bytes: Option<u64>,
}

impl Rest {
    /// The stacks of `left`, left out.
    pub fn of_stacks(left: &[StackReport]) -> Rest {
        Rest {
            what: "stacks",
            items: left.len() as u64,
            count: left.iter().map(|s| s.count).fold(0, u64::saturating_add),
            bytes: left
                .iter()
                .filter_map(|s| s.bytes)
                .reduce(u64::saturating_add),
        }
    }
}

/// Cuts rows (sorted, largest first) to `top` and says what the cut left
/// out, `count` being the events of a row.
pub fn cut<T>(
    v: &mut Vec<T>,
    top: Option<usize>,
    what: &'static str,
    count: impl Fn(&T) -> u64,
) -> Option<Rest> {
    let top = top.unwrap_or(usize::MAX);
    if v.len() <= top {
        return None;
    }
    let left = v.split_off(top);
    Some(Rest {
        what,
        items: left.len() as u64,
        count: left.iter().map(count).fold(0, u64::saturating_add),
        bytes: None,
    })
}

/// Stacks a text report shows when no `--top` is given; JSON, folded output
/// and records carry every stack unless `--top` is given.
pub const TEXT_TOP: usize = 20;

/// A power-of-two histogram.
#[derive(Debug, Clone, Default)]
pub struct Hist {
    pub title: String,
    pub unit: &'static str,
    /// buckets[i] counts values in [2^(i-1), 2^i), buckets[0] counts 0.
    pub buckets: Vec<u64>,
}

impl Hist {
    pub fn new(title: impl Into<String>, unit: &'static str) -> Self {
        Hist {
            title: title.into(),
            unit,
            buckets: Vec::new(),
        }
    }

    pub fn add(&mut self, v: u64) {
        let i = (64 - v.leading_zeros()) as usize;
        if self.buckets.len() <= i {
            self.buckets.resize(i + 1, 0);
        }
        self.buckets[i] += 1;
    }

    pub fn total(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// [low, high) of bucket i.
    pub fn range(i: usize) -> (u64, u64) {
        if i == 0 {
            (0, 1)
        } else {
            (1 << (i - 1), 1 << i)
        }
    }
}

/// What every run ends with.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub tool: &'static str,
    pub duration_s: f64,
    pub events: u64,
    /// (reason, count) for every loss counter, zero or not.
    pub lost: Vec<(&'static str, u64)>,
    /// (reason, count) for events kept in a lesser form (a truncated
    /// stack): reported, so not among the losses.
    pub degraded: Vec<(&'static str, u64)>,
    /// Counts shown apart from both, that are not known to be the target's
    /// (`host_missed_runs`: runs the kernel skipped anywhere on the host).
    pub apart: Vec<(&'static str, u64)>,
    /// (probe, method, target) as attached.
    pub attached: Vec<(String, String, String)>,
    /// Exit status of the command run with `-c`.
    pub command_status: Option<i32>,
    pub extra: Vec<(&'static str, Value)>,
}

impl Summary {
    pub fn total_lost(&self) -> u64 {
        self.lost.iter().map(|(_, n)| n).sum()
    }
}

pub trait Printer {
    /// One event line. Text printers print the header before the first.
    fn event(&mut self, kind: &'static str, cols: &[Col], row: &Row);
    /// One event line with its user stack (innermost first), for per-event
    /// stacks (mmapsnoop --stack).
    fn event_stack(&mut self, kind: &'static str, cols: &[Col], row: &Row, stack: &[Shown]) {
        let _ = stack;
        self.event(kind, cols, row);
    }
    /// A table printed every interval or at the end.
    fn table(&mut self, kind: &'static str, title: &str, cols: &[Col], rows: &[Row]);
    fn stacks(&mut self, kind: &'static str, title: &str, stacks: &[StackReport]);
    /// What the stacks or table rows just printed of `kind` left out past
    /// the top N. Required: every printer says it.
    fn rest(&mut self, kind: &'static str, rest: &Rest);
    fn histogram(&mut self, h: &Hist);
    fn summary(&mut self, s: &Summary);
    fn flush(&mut self) {}
    /// The first error writing the output, if any; after it nothing more is
    /// written.
    fn error(&self) -> Option<&std::io::Error>;
}

/// An error once the printer failed to write: `Error::Output`, which ends
/// the run (quietly for a closed pipe).
pub fn check(out: &dyn Printer) -> crate::Result<()> {
    match out.error() {
        None => Ok(()),
        // io::Error is not Clone: rebuild it from what it says.
        Some(e) => Err(crate::Error::Output(match e.raw_os_error() {
            Some(code) => std::io::Error::from_raw_os_error(code),
            None => std::io::Error::new(e.kind(), e.to_string()),
        })),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
    Folded,
}

/// Where the report goes: stdout, or the file `--output` names, created
/// (or truncated) before anything is attached so that a bad path is a
/// one-line error. Buffered: one write per drained batch, not per line.
pub fn destination(path: Option<&std::path::Path>) -> crate::error::Result<Box<dyn Write>> {
    const BUF: usize = 1 << 16;
    Ok(match path {
        None => {
            stdout_open()?;
            Box::new(std::io::BufWriter::with_capacity(BUF, std::io::stdout()))
        }
        Some(p) => {
            let f = std::fs::File::create(p).map_err(|e| {
                crate::error::Error::Usage(format!("--output {}: {e}", p.display()))
            })?;
            Box::new(std::io::BufWriter::with_capacity(BUF, f))
        }
    })
}

static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Notes whether memtrace was started with stdout closed, as the process
/// got it: called before Rust's runtime starts (main.rs, `.init_array`),
/// which opens /dev/null read-write on a standard descriptor a program
/// starts without. A /dev/null given as stdout (even read-write: Python's
/// `subprocess.DEVNULL`, `daemon()`) is open, and written to.
pub fn note_closed_stdout() {
    // SAFETY: fcntl with plain arguments.
    if unsafe { libc::fcntl(1, libc::F_GETFD) } == -1 {
        STDOUT_CLOSED.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// An error when memtrace was started with stdout closed.
pub fn stdout_open() -> crate::error::Result<()> {
    match STDOUT_CLOSED.load(std::sync::atomic::Ordering::Relaxed) {
        true => Err(crate::error::Error::Output(std::io::Error::other(
            "stdout is closed, and the report would be lost (--output FILE writes it to a file)",
        ))),
        false => Ok(()),
    }
}

pub fn printer(format: Format, timestamps: bool, out: Box<dyn Write>) -> Box<dyn Printer> {
    match format {
        Format::Text => Box::new(TextPrinter::new(out, timestamps)),
        Format::Json => Box::new(JsonPrinter::new(out)),
        Format::Folded => Box::new(FoldedPrinter::new(out, timestamps)),
    }
}

/// Escapes what a terminal would act on in text that comes from the traced
/// system (command names, paths, symbols): C0 controls, DEL and C1 controls.
/// A process can set its name to anything (`prctl(PR_SET_NAME)`): raw, an
/// ESC sequence repaints the operator's terminal and a newline forges a row.
/// `ps` prints `?` for these; C-style escapes (`\n`, `\x1b`, `\u{9b}`) are
/// used instead because they show what the process actually set, which is
/// what someone hunting a disguised process wants to see. Backslashes are
/// doubled so that a name cannot fake an escape.
pub fn escape_controls(s: &str) -> std::borrow::Cow<'_, str> {
    let special = |c: char| c.is_control() || c == '\\';
    if !s.chars().any(special) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x80 && c.is_control() => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Local wall-clock time as HH:MM:SS.
pub fn clock() -> String {
    let now = unsafe { libc::time(std::ptr::null_mut()) };
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call.
    unsafe { libc::localtime_r(&now, &mut tm) };
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}
