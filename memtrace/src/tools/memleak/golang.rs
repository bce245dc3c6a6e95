//! memleak on a Go program: Go's allocator never calls malloc, so what the
//! probes see is only the runtime taking memory from the OS (its arena
//! reservations, many times its heap). The Go heap in use by stack is
//! read instead from the runtime's own sampled profile
//! (`process::goheap`), as `runtime/pprof` estimates it, at every report
//! and, for a `-c` command, as it stops at its exit (under ptrace, its
//! memory still mapped); a `-p` process that exits first is reported as
//! last read while it ran.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::output::{Printer, Value};
use crate::probes::heap::golang::Read;
use crate::process::goheap::{GoHeap, NotRead, Profile, DEFAULT_RATE};
use crate::stacks::Traced;

/// How often the profile is read between reports, so that a program that
/// exits leaves one read close to its end.
const EVERY: Duration = Duration::from_millis(200);

/// The last read: the profile, when, and whether at the process's exit.
type Last = Arc<Mutex<Option<(Profile, Instant, bool)>>>;

#[derive(Default)]
pub(super) struct GoView {
    pid: Option<u32>,
    heap: Option<Result<Arc<GoHeap>, NotRead>>,
    last: Last,
    read_at: Option<Instant>,
    /// The program's name, for the arenas left out of the malloc report.
    pub exe_name: Option<String>,
    said: bool,
    /// Its name, taken when it was opened (it may be gone by a report).
    comm: String,
    /// Where the linker left profiling off: memtrace turned it on, and
    /// when ("before it started", "at HH:MM:SS").
    turned_on: Option<String>,
    /// The last report's figures: estimated objects and bytes in use, and
    /// the samples behind them.
    shown: (u64, u64, u64),
}

impl GoView {
    /// Whether `pid` is a Go program; its profile is opened then.
    pub fn open(&mut self, pid: u32) -> bool {
        if self.pid == Some(pid) {
            return true;
        }
        // Not kept when not Go: a command not exec'd yet is asked again.
        let heap = GoHeap::open(pid);
        if matches!(heap, Err(NotRead::NotGo)) {
            return false;
        }
        self.pid = Some(pid);
        self.comm = crate::process::proc::comm(pid).unwrap_or_default();
        self.exe_name = std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .and_then(|p| Some(p.file_name()?.to_string_lossy().into_owned()));
        self.heap = Some(heap.map(Arc::new));
        true
    }

    /// Where the linker left the program's profiling off: turned on, and
    /// said; with `leave` (--no-inject), left off and said at the report.
    pub fn turn_on(&mut self, leave: bool, before_start: bool) {
        let (Some(pid), Some(Ok(heap))) = (self.pid, &self.heap) else {
            return;
        };
        if !heap.linker_off() || self.turned_on.is_some() {
            return;
        }
        if leave {
            self.heap = Some(Err(NotRead::ProfilingOff));
            return;
        }
        if let Err(e) = heap.turn_on() {
            say!(
                "memtrace: memleak: warning: PID {pid}: turning Go's heap profiling on failed: {e}"
            );
            self.heap = Some(Err(NotRead::ProfilingOff));
            return;
        }
        let when = match before_start {
            true => "before it started".to_string(),
            false => format!("at {}", crate::output::clock()),
        };
        say!(
            "memtrace: memleak: PID {pid} is a Go program whose linker left heap profiling off: \
             turned on {when} at Go's default rate (one sample per {DEFAULT_RATE} bytes), put \
             back at exit (--no-inject leaves the program as it is)"
        );
        self.turned_on = Some(when);
    }

    /// Profiling put back off where memtrace turned it on.
    pub fn put_back(&self) {
        if let (Some(_), Some(Ok(heap))) = (&self.turned_on, &self.heap) {
            heap.put_back();
        }
    }

    /// What reads the profile as the process stops at its exit (for the
    /// maps cache to run then): None when it cannot be read.
    pub fn exit_hook(&self) -> Option<Box<dyn FnMut(u32) + Send>> {
        let (Some(pid), Some(Ok(heap))) = (self.pid, &self.heap) else {
            return None;
        };
        let (heap, last) = (heap.clone(), self.last.clone());
        Some(Box::new(move |p| {
            if p == pid {
                if let Ok(prof) = heap.read() {
                    *last.lock().unwrap() = Some((prof, Instant::now(), true));
                }
            }
        }))
    }

    /// Whether the traced process is a Go program.
    pub fn is_go(&self) -> bool {
        self.heap.is_some()
    }

    /// The runtime's reservations are left out of the malloc report only
    /// when the Go heap is shown instead.
    pub fn readable(&self) -> bool {
        matches!(self.heap, Some(Ok(_)))
    }

    /// Reads the profile if it is due (or `now`).
    pub fn tick(&mut self, now: bool) {
        let due = self.read_at.is_none_or(|t| t.elapsed() >= EVERY);
        let Some(Ok(heap)) = &self.heap else {
            return;
        };
        if !(now || due) {
            return;
        }
        self.read_at = Some(Instant::now());
        // Gone: the last read stands (the one at its exit, if made).
        if let Ok(p) = heap.read() {
            *self.last.lock().unwrap() = Some((p, Instant::now(), false));
        }
    }

    /// The Go heap section of a report.
    pub fn report(&mut self, s: &mut Traced, out: &mut dyn Printer) {
        let Some(pid) = self.pid else {
            return;
        };
        self.tick(true);
        if let Some(Err(why)) = &self.heap {
            if !self.said {
                self.said = true;
                say!(
                    "memtrace: memleak: warning: PID {pid} is a Go program and its Go heap cannot \
                     be read by function: {why}. The allocations shown are the Go runtime's \
                     reservations from the OS, not its heap in use"
                );
            }
            return;
        }
        // Out of the lock before symbolizing: the exit hook takes it
        // under the maps' lock, which symbolizing takes.
        let Some((p, at, at_exit)) = self.last.lock().unwrap().clone() else {
            return;
        };
        let read = Read::of(s, pid, &self.comm, &p);
        let (objects, bytes) = read.in_use();
        self.shown = (objects, bytes, read.samples);
        let age = at.elapsed().as_secs_f64();
        let gone = crate::process::proc::comm(pid).is_none();
        let when = match (at_exit, gone, age >= 1.0) {
            (true, _, _) => ", as read at its exit".to_string(),
            (false, true, _) => format!(", as last read while it ran, {age:.1} s ago"),
            (false, false, true) => format!(", as read {age:.1} s ago"),
            (false, false, false) => String::new(),
        };
        let when = match &self.turned_on {
            Some(w) if w.starts_with("before") => format!("{when}; turned on by memtrace {w}"),
            Some(w) => {
                format!("{when}; turned on by memtrace {w}: what was allocated before is not seen")
            }
            None => when,
        };
        let title = format!(
            "[{}] Go heap in use by stack (PID {pid}): {}:",
            crate::output::clock(),
            read.about(&when)
        );
        out.stacks("go_heap", &title, &read.rows);
    }
}

impl GoView {
    /// The summary's rows: the Go heap shown, or why it could not be read.
    pub fn summary(&self) -> Vec<(&'static str, Value)> {
        match (&self.heap, &*self.last.lock().unwrap()) {
            (Some(Ok(_)), Some((p, ..))) => vec![
                ("go_heap_objects", Value::from(self.shown.0)),
                ("go_heap_bytes", Value::from(self.shown.1)),
                ("go_heap_samples", Value::from(self.shown.2)),
                ("go_profile_rate", Value::from(p.rate)),
                ("go_profile_damaged", Value::from(p.damaged as u64)),
                (
                    "go_profile_turned_on",
                    Value::from(self.turned_on.is_some() as u64),
                ),
            ],
            (Some(Err(why)), _) => vec![("go_heap_unread", Value::from(why.to_string()))],
            _ => Vec::new(),
        }
    }
}
