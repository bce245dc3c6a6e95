//! memcg's `--heap` through the allocator shim: loaded into each process
//! of the watched groups as it is taken in, so that a sampled allocation
//! costs what it costs in a preloaded command (a few ns a call) instead of
//! a uprobe's trap on every call (about 1 us). A child forked after the
//! load has the shim from its parent; a process it cannot be loaded into
//! (seccomp, traced, static, another C library) gets uprobes of its own.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::injection::Injection;
use super::shim;
use crate::error::Result;
use crate::output::Value;
use crate::session::attach::Probe;

pub struct Shimmed {
    shim: shim::Installed,
    sample: u64,
    tool: &'static str,
    verbose: bool,
    /// Loaded before the probes were on: redirected at `start`.
    pending: Vec<(Injection, u64)>,
    /// Each process's injection, with when it was loaded (CLOCK_MONOTONIC
    /// ns, the kernel's clock for execs).
    by_pid: HashMap<u32, (Injection, u64)>,
    started: bool,
    /// Processes whose calls were pointed at the shim.
    loaded: u64,
    /// Processes taken in that had the shim already (forked from one).
    inherited: u64,
    /// Processes it could not be loaded into (uprobes instead).
    refused: u64,
    /// Slots put back at the end, and those the processes had rewritten.
    restored: (usize, usize),
    /// When the latest loads were tried (a churn's rate).
    recent: std::collections::VecDeque<std::time::Instant>,
    /// Why loads were refused, each said once.
    said: std::collections::HashSet<String>,
    /// Libraries loaded after a process's calls were pointed at the shim,
    /// pointed there too (`catch_up`), and the last pid looked at.
    late: usize,
    cursor: u32,
}

/// Processes looked at per housekeeping round for libraries loaded since
/// (a read of each one's maps): a bounded cost however big the groups.
const CATCH_UP: usize = 4;

/// Loads tried in the last second past which the groups churn: only
/// processes old enough are loaded then (`HeapWatch::too_young`).
const CHURN: usize = 20;

impl Shimmed {
    pub fn new(sample: u64, tool: &'static str, verbose: bool) -> Result<Shimmed> {
        Ok(Shimmed {
            shim: shim::install()?,
            sample,
            tool,
            verbose,
            pending: Vec::new(),
            by_pid: HashMap::new(),
            started: false,
            loaded: 0,
            inherited: 0,
            refused: 0,
            restored: (0, 0),
            recent: Default::default(),
            late: 0,
            cursor: 0,
            said: Default::default(),
        })
    }

    /// The probes on the shim's sites, for every process that maps it
    /// (the kernel programs keep the watched groups' calls).
    pub fn probes(&self) -> Result<Vec<Probe>> {
        Ok(shim::probes(self.shim.path(), None)?.0)
    }

    /// Whether loads were tried by the dozen in the last second.
    pub fn busy(&mut self) -> bool {
        let now = std::time::Instant::now();
        while self
            .recent
            .front()
            .is_some_and(|t| now - *t > std::time::Duration::from_secs(1))
        {
            self.recent.pop_front();
        }
        self.recent.len() >= CHURN
    }

    /// Takes `pid` in. Some(Some(probes)) when its calls go through the
    /// shim (now, or at `start`): probes on a copy of the shim in its
    /// mount namespace, which the shared probes do not cover. Some(None)
    /// when it changed meanwhile (exec, exit): to be looked at again. None
    /// when uprobes must do.
    pub fn take(&mut self, pid: u32) -> Option<Option<Vec<Probe>>> {
        if maps_shim(pid) {
            self.inherited += 1;
            return Some(Some(Vec::new()));
        }
        let at = monotonic_ns();
        self.recent.push_back(std::time::Instant::now());
        let before = identity(pid);
        let (mut i, said) = match Injection::start(pid, self.shim.path(), self.sample, self.tool) {
            Ok(s) => s,
            // It exec'd or exited meanwhile: looked at again.
            Err(_) if identity(pid) != before || before.is_none() => return Some(None),
            Err(why) => {
                self.refused += 1;
                // Once per reason: a group of many alike says it once.
                if self.said.insert(why.clone()) {
                    say!(
                        "memtrace: {}: not loading the allocator shim into pid {pid}: {why}; \
                         uprobes instead (said once; heap_shim_refused counts them)",
                        self.tool
                    );
                }
                return None;
            }
        };
        if self.verbose {
            for s in said {
                say!("memtrace: {}: {s}", self.tool);
            }
        }
        // A process's own copy is mapped by it and its forks alone.
        let probes = match same_file(i.shim(), self.shim.path()) {
            true => Vec::new(),
            false => match shim::sites(i.shim(), None) {
                Ok(p) => p,
                Err(e) => {
                    say!(
                        "memtrace: {}: pid {pid}: its copy of the shim: {e}; uprobes instead",
                        self.tool
                    );
                    self.refused += 1;
                    return None;
                }
            },
        };
        if !self.started {
            self.pending.push((i, at));
            return Some(Some(probes));
        }
        if i.redirect(self.verbose).is_err() {
            i.restore();
            self.refused += 1;
            return None;
        }
        self.by_pid.insert(pid, (i, at));
        self.loaded += 1;
        Some(Some(probes))
    }

    /// Once the probes are on: the processes loaded before point their
    /// calls at the shim.
    pub fn start(&mut self) -> Result<()> {
        self.started = true;
        for (mut i, at) in std::mem::take(&mut self.pending) {
            i.redirect(self.verbose)?;
            self.by_pid.insert(i.pid(), (i, at));
            self.loaded += 1;
        }
        Ok(())
    }

    /// Process `pid` exec'd at `at_ns`: whether it is to be taken in again
    /// (its new image has no shim). One loaded after the exec keeps it.
    pub fn exec(&mut self, pid: u32, at_ns: u64) -> bool {
        match self.by_pid.get_mut(&pid) {
            Some((_, loaded)) if *loaded > at_ns => false,
            Some((i, _)) => {
                i.abandon();
                self.by_pid.remove(&pid);
                true
            }
            None => true,
        }
    }

    /// Processes gone (not kept by `alive`): nothing to put back.
    pub fn forget_gone(&mut self, alive: impl Fn(u32) -> bool) {
        // Not put back on drop: its pid may be another process's by now.
        self.by_pid.retain(|&p, (i, _)| {
            let keep = alive(p);
            if !keep {
                i.abandon();
            }
            keep
        });
    }

    /// Every live process's calls put back as they were.
    pub fn restore(&mut self) {
        for (_, (mut i, _)) in self.by_pid.drain() {
            i.restore();
            if let Some((put, changed)) = i.restored() {
                self.restored.0 += put;
                self.restored.1 += changed;
            }
        }
    }

    /// Up to `CATCH_UP` processes, in turn: a library one loaded since
    /// (a dlopen, a Python extension imported) gets its allocator calls
    /// pointed at the shim too (`Injection::catch_up`, which says so).
    pub fn catch_up(&mut self) {
        let mut pids: Vec<u32> = self.by_pid.keys().copied().collect();
        pids.sort_unstable();
        let from = pids.partition_point(|&p| p <= self.cursor);
        let n = CATCH_UP.min(pids.len());
        for &p in pids.iter().cycle().skip(from).take(n) {
            if let Some((i, _)) = self.by_pid.get_mut(&p) {
                self.late += i.catch_up();
            }
            self.cursor = p;
        }
    }

    pub fn summary(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("heap_shim_processes", Value::from(self.loaded)),
            ("heap_shim_late_libraries", Value::from(self.late as u64)),
            ("heap_shim_inherited", Value::from(self.inherited)),
            ("heap_shim_refused", Value::from(self.refused)),
            ("restored_slots", Value::from(self.restored.0 as u64)),
            (
                "slots_changed_by_process",
                Value::from(self.restored.1 as u64),
            ),
        ]
    }
}

/// Whether `pid` maps the shim (a child forked from a process it was
/// loaded into, or a preloaded command).
fn maps_shim(pid: u32) -> bool {
    crate::process::maps::read_maps(pid).is_some_and(|m| {
        m.iter().any(|m| {
            Path::new(&*m.path)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains(super::SHIM_PREFIX))
        })
    })
}

/// Whether two paths name one file (the process's view of the shim, through
/// /proc/PID/root, and memtrace's).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

fn monotonic_ns() -> u64 {
    // SAFETY: a timespec to fill.
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// A process's image: its executable and start time (None once gone).
fn identity(pid: u32) -> Option<(PathBuf, u64)> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    Some((exe, crate::process::proc::start_time(pid)?))
}
