//! `--record FILE`: a printer in front of the live one. Every stack report
//! of every tool passes through `Printer::stacks` (or `event_stack` for
//! per-event stacks), so recording is done here once, for all of them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::Path;
use std::time::Instant;

use super::format::{self, Header, Item, Report, Stack, Trailer};
use super::stream::Items;
use crate::error::{Error, Result};
use crate::output::frame::Frame;
use crate::output::frame::FrameStyle;
use crate::output::{Col, Hist, Printer, Rest, Row, Shown, StackReport, Summary, Value};

/// Per-event stacks are summed and written this often (and at the end).
const EVENT_STACKS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

type EventKey = (&'static str, u32, String, Vec<Shown>);

pub struct Recorder {
    inner: Box<dyn Printer>,
    file: Items<File>,
    error: Option<std::io::Error>,
    started: Instant,
    seq: u64,
    /// How the user asked frames to be printed; the record keeps more
    /// (source lines), stripped here for the live output.
    shown: FrameStyle,
    modules: HashSet<String>,
    events: HashMap<EventKey, (u64, Option<u64>)>,
    events_written: Instant,
}

impl Recorder {
    /// Creates `path` and writes its header.
    pub fn create(
        inner: Box<dyn Printer>,
        path: &Path,
        tool: &str,
        shown: FrameStyle,
        per_pid: bool,
    ) -> Result<Recorder> {
        let bad = |e: std::io::Error| {
            Error::Usage(format!("cannot write record {}: {e}", path.display()))
        };
        let mut file = File::create(path).map_err(bad)?;
        let header = Header {
            magic: format::MAGIC.into(),
            version: format::VERSION,
            memtrace: env!("CARGO_PKG_VERSION").into(),
            tool: tool.into(),
            args: std::env::args().skip(1).collect(),
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            host: read_trimmed("/proc/sys/kernel/hostname"),
            start: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
            style: format::style_name(shown).into(),
            per_pid,
        };
        format::write_start(&mut file, header).map_err(bad)?;
        let file = Items::new(file);
        crate::stacks::buildid::enable();
        Ok(Recorder {
            inner,
            file,
            error: None,
            started: Instant::now(),
            seq: 0,
            shown,
            modules: HashSet::new(),
            events: HashMap::new(),
            events_written: Instant::now(),
        })
    }

    fn write(&mut self, kind: &str, title: &str, stacks: Vec<Stack>) {
        if self.error.is_some() {
            return;
        }
        let mut build_ids = BTreeMap::new();
        for s in &stacks {
            for m in s.user.iter().filter_map(|f| f.module.as_deref()) {
                if self.modules.insert(m.to_string()) {
                    if let Some(id) = crate::stacks::buildid::of(m) {
                        build_ids.insert(m.to_string(), id);
                    }
                }
            }
        }
        let item = Item::Report(Report {
            seq: self.seq,
            at: self.started.elapsed().as_secs_f64(),
            kind: kind.into(),
            title: title.into(),
            stacks,
            build_ids,
        });
        self.seq += 1;
        if let Err(e) = self.file.write(&item) {
            self.error = Some(e);
        }
    }

    /// Frames as the user asked to see them.
    fn shown(&self, frames: &[Shown]) -> Vec<Shown> {
        frames
            .iter()
            .map(|f| Frame::parse(f).render(self.shown).into())
            .collect()
    }

    fn write_events(&mut self) {
        let mut by_kind: BTreeMap<&'static str, Vec<Stack>> = BTreeMap::new();
        for ((kind, pid, comm, user), (count, bytes)) in self.events.drain() {
            by_kind
                .entry(kind)
                .or_default()
                .push(Stack::from_report(&StackReport {
                    pid,
                    comm,
                    count,
                    bytes,
                    user,
                    processes: 1,
                    ..Default::default()
                }));
        }
        for (kind, mut stacks) in by_kind {
            stacks.sort_by_key(|s| std::cmp::Reverse(s.count));
            self.write(kind, "", stacks);
        }
        self.events_written = Instant::now();
    }
}

fn read_trimmed(p: &str) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The value of column `key` in `row`.
fn cell<'a>(cols: &[Col], row: &'a Row, key: &str) -> Option<&'a Value> {
    cols.iter()
        .position(|c| c.key == key)
        .and_then(|i| row.0.get(i))
}

impl Printer for Recorder {
    fn event(&mut self, kind: &'static str, cols: &[Col], row: &Row) {
        self.inner.event(kind, cols, row)
    }

    fn event_stack(&mut self, kind: &'static str, cols: &[Col], row: &Row, stack: &[Shown]) {
        let pid = match cell(cols, row, "pid") {
            Some(Value::U(p)) => *p as u32,
            _ => 0,
        };
        let comm = match cell(cols, row, "comm") {
            Some(Value::S(s)) => s.clone(),
            _ => String::new(),
        };
        let len = match cell(cols, row, "len") {
            Some(Value::U(n)) => Some(*n),
            _ => None,
        };
        let e = self
            .events
            .entry((kind, pid, comm, stack.to_vec()))
            .or_insert((0, len.map(|_| 0)));
        e.0 += 1;
        e.1 = e.1.map(|b| b + len.unwrap_or(0));
        let shown = self.shown(stack);
        self.inner.event_stack(kind, cols, row, &shown)
    }

    fn table(&mut self, kind: &'static str, title: &str, cols: &[Col], rows: &[Row]) {
        if self.error.is_none() {
            let at = self.started.elapsed().as_secs_f64();
            let t = super::table::Table::new(self.seq, at, kind, title, cols, rows);
            self.seq += 1;
            if let Err(e) = self.file.write(&Item::Table(t)) {
                self.error = Some(e);
            }
        }
        self.inner.table(kind, title, cols, rows)
    }

    /// The record keeps every stack; only what is shown was cut.
    fn rest(&mut self, kind: &'static str, rest: &Rest) {
        self.inner.rest(kind, rest)
    }

    fn stacks(&mut self, kind: &'static str, title: &str, stacks: &[StackReport]) {
        self.write(kind, title, stacks.iter().map(Stack::from_report).collect());
        let shown: Vec<StackReport> = stacks
            .iter()
            .map(|s| StackReport {
                user: self.shown(&s.user),
                kernel: self.shown(&s.kernel),
                ..s.clone()
            })
            .collect();
        self.inner.stacks(kind, title, &shown)
    }

    fn histogram(&mut self, h: &Hist) {
        self.inner.histogram(h)
    }

    fn summary(&mut self, s: &Summary) {
        self.write_events();
        if self.error.is_none() {
            let t = Trailer {
                reports: self.seq,
                duration_s: s.duration_s,
                events: s.events,
                lost: s.lost.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
                command_status: s.command_status,
            };
            if let Err(e) = self
                .file
                .write(&Item::Trailer(t))
                .and_then(|()| self.file.finish())
            {
                self.error = Some(e);
            }
        }
        self.inner.summary(s)
    }

    fn flush(&mut self) {
        if !self.events.is_empty() && self.events_written.elapsed() >= EVENT_STACKS_EVERY {
            self.write_events();
        }
        // Each item was flushed through to the file as it was written.
        self.inner.flush();
    }

    fn error(&self) -> Option<&std::io::Error> {
        self.inner.error().or(self.error.as_ref())
    }
}
