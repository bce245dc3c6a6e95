//! memcg's `--heap` through the allocator shim (`super::super::shimmed`):
//! the set-up, and each process taken in through it or, where it cannot
//! be loaded, by uprobes of its own.

use memtrace_common::memleak::MemleakConfig;

use super::super::points::{self, Points};
use super::super::shimmed::Shimmed;
use super::{size_tables, HeapWatch};
use crate::error::Result;
use crate::session::attach::Probe;

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
            Some(p) => p,
            None => self.uprobes_of(pid),
        }
    }

    /// Uprobes for `pid` alone, on the allocator it maps.
    fn uprobes_of(&mut self, pid: u32) -> Vec<Probe> {
        let at = Points {
            running: Some(pid),
            only: Some(pid),
            session: true,
            ..Default::default()
        };
        match points::user(&at) {
            Ok(p) => {
                self.note(&p);
                p.probes
            }
            Err(e) => {
                self.unprobed += 1;
                let name = crate::process::proc::comm(pid).unwrap_or_default();
                say!("memtrace: warning: --heap: PID {pid} ({name}): its heap is not seen: {e}");
                Vec::new()
            }
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
}
