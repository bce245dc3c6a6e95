//! A tracing session: the loaded object (`loader`), its probes attached
//! through their fallback chains (`engine`), its maps read (`maps`), and the
//! records its programs send decoded (`records`).
//! Dropping it detaches and unloads everything.

pub mod attach;
mod cookie;
mod engine;
mod generations;
mod loader;
mod maps;
mod misses;
mod multi;
mod prep;
pub mod records;
pub mod uprobe;
mod ustacks;
pub mod why;

use std::collections::HashSet;

use aya::{Btf, Ebpf};

pub use loader::{compat, Loader};
pub use maps::{first_name, is_degradation, Fold, DEGRADATIONS};
pub use prep::Prep;

use crate::error::Result;
use crate::session::attach::Method;

pub struct Session {
    pub(crate) bpf: Ebpf,
    btf: Option<Btf>,
    forced: Option<Method>,
    verbose: bool,
    /// Programs loaded so far (a program attached by several ways or to
    /// several targets is loaded once).
    loaded: HashSet<&'static str>,
    /// Attach methods ruled out before trying, with the reason (offsets
    /// the method's program needs that this kernel's BTF lacks).
    ruled_out: Vec<(&'static str, String)>,
    /// (probe, method, target) for each probe attached.
    pub attached: Vec<(String, String, String)>,
    /// Links memtrace made itself (tracepoints with a cookie); closing them
    /// detaches.
    raw_links: Vec<std::os::fd::OwnedFd>,
    /// Every link aya made, taken from its program so that the run can
    /// detach them apart from the maps (`detach_in_background`).
    links: Vec<Box<dyn Send>>,
    /// Programs memtrace loaded itself (uprobe sessions), for their
    /// skipped runs.
    raw_progs: Vec<std::os::fd::OwnedFd>,
    /// The kernel's loss counters and missed runs when the run ended.
    counted_at_end: Option<(Vec<(&'static str, u64)>, u64)>,
    /// Map reads the kernel refused (not a key deleted meanwhile): each
    /// one left entries out of a report, so it is a loss.
    pub(crate) read_fails: std::cell::Cell<u64>,
    /// The programs filter by process (`-p`, `-c`): runs the kernel skipped
    /// are then not known to be the target's (it skips before the filter).
    pub filtered: bool,
    /// Count generations (`generations`).
    gens: generations::Generations,
}

/// An error and its causes on one line.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let cs = c.to_string();
        if !s.contains(&cs) {
            s.push_str(": ");
            s.push_str(&cs);
        }
        cur = c.source();
    }
    s
}

/// Links being closed on their own threads; `wait` before the process ends.
pub struct Detaching(Vec<std::thread::JoinHandle<()>>);

impl Detaching {
    /// Returns once every link is closed (as dropping it does).
    pub fn wait(self) {}
}

impl Drop for Detaching {
    fn drop(&mut self) {
        for h in self.0.drain(..) {
            let _ = h.join();
        }
    }
}

impl Session {
    /// Detaches every probe on other threads while the caller goes on with
    /// the maps: each tracepoint or uprobe detached waits for the kernel's
    /// grace periods (50 ms each on a churning host, 0.4 s for the eight of
    /// a host-wide `faults --stacks` one after another). Eight threads
    /// share the waits; the final report no longer waits behind them.
    pub fn detach_in_background(&mut self) -> Detaching {
        const THREADS: usize = 8;
        let mut groups: Vec<Vec<Box<dyn Send>>> = (0..THREADS).map(|_| Vec::new()).collect();
        let links = std::mem::take(&mut self.links).into_iter();
        let raw = std::mem::take(&mut self.raw_links).into_iter();
        let all = links.chain(raw.map(|fd| Box::new(fd) as Box<dyn Send>));
        for (i, l) in all.enumerate() {
            groups[i % THREADS].push(l);
        }
        let handles = groups
            .into_iter()
            .filter(|g| !g.is_empty())
            .filter_map(|g| {
                // No thread: the group was closed here, by the failed spawn.
                std::thread::Builder::new()
                    .name("memtrace-detach".into())
                    .spawn(move || drop(g))
                    .ok()
            })
            .collect();
        Detaching(handles)
    }

    /// `r`'s value, or None with the failure counted (`read_fails`).
    pub(crate) fn counted<T, E>(&self, r: std::result::Result<T, E>) -> Option<T> {
        r.map_err(|_| self.read_fails.set(self.read_fails.get() + 1))
            .ok()
    }

    pub fn load(spec: &Loader, forced: Option<Method>, verbose: bool) -> Result<Session> {
        Ok(Session {
            bpf: spec.load()?,
            btf: None,
            forced,
            verbose,
            loaded: HashSet::new(),
            ruled_out: spec.ruled_out().to_vec(),
            attached: Vec::new(),
            raw_links: Vec::new(),
            links: Vec::new(),
            raw_progs: Vec::new(),
            counted_at_end: None,
            filtered: false,
            read_fails: std::cell::Cell::new(0),
            gens: generations::Generations::new()?,
        })
    }

    fn btf(&mut self) -> std::result::Result<&Btf, why::WayError> {
        if self.btf.is_none() {
            let btf = Btf::from_sys_fs()
                .map_err(|e| why::WayError::Unavailable(format!("no kernel BTF: {e}")))?;
            self.btf = Some(btf);
        }
        Ok(self.btf.as_ref().unwrap())
    }
}
