//! memcg's `--heap` through the allocator shim (`super::super::shimmed`):
//! the set-up, and each process taken in through it or, where it cannot
//! be loaded, by uprobes of its own.

use memtrace_common::memcg::MemcgProc;
use memtrace_common::memleak::MemleakConfig;
use memtrace_common::names;

use super::super::shimmed::Shimmed;
use std::time::Duration;

use super::{allocator_key, size_tables, HeapWatch};
use crate::error::Result;
use crate::process::maps::Mapping;
use crate::session::attach::Probe;
use crate::stacks::Traced;

impl HeapWatch {
    /// The processes' calls through the allocator shim loaded into each,
    /// when `on` (the shim installed now: an error says why it cannot be).
    pub fn shimmed(mut self, on: bool, tool: &'static str, verbose: bool) -> Result<HeapWatch> {
        if on && super::super::shim::built() {
            self.shim = Some(Shimmed::new(self.sample, tool, verbose)?);
        }
        Ok(self)
    }

    /// Whether processes are taken in through the shim (as soon as they
    /// are found: their calls are not seen before).
    pub fn shimmed_in(&self) -> bool {
        self.shim.is_some()
    }

    /// Once the probes are on.
    pub fn start(&mut self) -> Result<()> {
        match self.shim.as_mut() {
            Some(sh) => sh.start(),
            None => Ok(()),
        }
    }

    /// At the end: the calls pointed at the shim put back.
    pub fn finish(&mut self) {
        if let Some(sh) = self.shim.as_mut() {
            sh.restore();
        }
    }

    /// Takes `pid` in through the shim: the probes to attach for it (on
    /// its copy of the shim, or its own uprobes where the shim could not
    /// be loaded).
    pub(super) fn shim_in(&mut self, pid: u32) -> Vec<Probe> {
        let Some(sh) = self.shim.as_mut() else {
            return Vec::new();
        };
        match sh.take(pid) {
            Some(Some(p)) => p,
            // Changed meanwhile: looked at again at the next look.
            Some(None) => {
                self.seen.remove(&pid);
                self.taken.remove(&pid);
                Vec::new()
            }
            // Uprobes for it alone.
            None => self.probe_allocator(pid, Some(pid)).unwrap_or_default(),
        }
    }

    /// The set-up through the shim: loaded into `pids` now (their calls
    /// pointed at it once the probes are on), probes on its sites. No
    /// mmap tracepoints: the shim reports the processes' anonymous mmaps,
    /// and glibc's own mmaps of big blocks are the blocks malloc returns.
    pub(super) fn prepare_shim(
        &mut self,
        loader: &mut crate::session::Loader,
        cfg: MemleakConfig,
        pids: &[u32],
    ) -> Result<()> {
        // With the execs and the exits of threads holding batches of frees.
        if let Some(sh) = &self.shim {
            self.probes.extend(sh.probes()?);
        }
        for &pid in pids {
            if self.taken.insert(pid) {
                let p = self.shim_in(pid);
                self.probes.extend(p);
            }
        }
        size_tables(loader, &cfg);
        if std::mem::replace(&mut self.said, true) {
            return Ok(());
        }
        say!(
            "memtrace: --heap: allocator calls ({}) through the allocator shim, loaded into each \
             process of the watched groups as it is found (a few ns a call; a process it cannot \
             be loaded into gets uprobes, and says why; --no-inject: uprobes for all)",
            self.sampled()
        );
        Ok(())
    }

    /// A process of the groups found by the look for newcomers: its maps
    /// read (in `follow`), the shim loaded into it or its own uprobes.
    pub(super) fn follow_shim(&mut self, s: &mut Traced, pid: u32, maps: &[Mapping]) -> Result<()> {
        if self.taken.remove(&pid) {
            return Ok(());
        }
        // Caught between its exec and its loader's mapping of libc: looked
        // at again next time.
        let exe = std::path::PathBuf::from(format!("/proc/{pid}/exe"));
        if !allocator_key(maps).is_some_and(|k| k.1) && !crate::session::uprobe::is_static(&exe) {
            self.seen.remove(&pid);
            return Ok(());
        }
        let before = s.hash_get(names::MEMCG_PROCS, &pid);
        let probes = self.shim_in(pid);
        uncredit_load(s, pid, before)?;
        self.attach_for(s, pid, &probes)
    }

    /// Whether `pid` is too young to load the shim into while the groups
    /// start processes by the dozen a second: a churn of short-lived
    /// processes (a build) would each be stopped for the load. Those gone
    /// before they are old enough are counted (`heap_gone_before_shim`):
    /// what they allocated is not seen.
    pub(super) fn too_young(&mut self, pid: u32) -> bool {
        let churn = self.shim.as_mut().is_some_and(|sh| sh.busy());
        let young = churn && age(pid).is_some_and(|a| a < MIN_AGE);
        match young {
            true => self.young.insert(pid),
            false => self.young.remove(&pid),
        };
        young
    }
}

/// How old a process must be before the shim is loaded into it, under a
/// churn.
const MIN_AGE: Duration = Duration::from_millis(50);

/// How long ago `pid` started (its start time has the kernel's clock
/// ticks' granularity, 10 ms).
fn age(pid: u32) -> Option<Duration> {
    let ticks = crate::process::proc::start_time(pid)?;
    // SAFETY: sysconf and a timespec to fill.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut t) };
    let now = Duration::new(t.tv_sec as u64, t.tv_nsec as u32);
    Some(now.saturating_sub(Duration::from_millis(ticks * 1000 / hz)))
}

/// The shim's load (memtrace's dlopen, run in one of the process's threads)
/// changes its RSS: the growth stack memcg keeps for it must not become
/// that load's, or a process that grew by itself is shown growing in
/// memtrace's dlopen. Its stack before the load is put back (none, if it
/// had none: its next growth takes one). Every thread was held meanwhile,
/// so no change of its own is undone.
fn uncredit_load(s: &mut Traced, pid: u32, before: Option<MemcgProc>) -> Result<()> {
    let Some(mut now) = s.hash_get(names::MEMCG_PROCS, &pid) else {
        return Ok(());
    };
    let (ustack, kstack, stack_at) =
        before.map_or((-1, -1, 0), |b| (b.ustack, b.kstack, b.stack_at));
    if (now.ustack, now.kstack) == (ustack, kstack) {
        return Ok(());
    }
    (now.ustack, now.kstack, now.stack_at) = (ustack, kstack, stack_at);
    // BPF_EXIST (uapi): gone meanwhile (it exited), it stays gone.
    match s.hash_insert(names::MEMCG_PROCS, pid, now, 2) {
        Err(_) if s.hash_get(names::MEMCG_PROCS, &pid).is_none() => Ok(()),
        r => r,
    }
}
