//! Taking a set's processes in: each one's maps read, and the probes on
//! its allocator attached (where the shim does not go in instead).

use super::points::{self, Points};
use super::{allocator_key, HeapWatch};
use crate::error::Result;
use crate::process::maps::Mapping;
use crate::session::attach::Probe;
use crate::stacks::Traced;

impl HeapWatch {
    /// The probes for `pid`'s allocator if it is one not probed yet.
    pub(super) fn allocator_of(&mut self, pid: u32, maps: &[Mapping]) -> Option<Vec<Probe>> {
        let (key, libs) = allocator_key(maps)?;
        if self.objects.contains(&key) {
            return None;
        }
        // Caught between its exec and its loader's mapping of libc (no
        // library, not static): looked at again next time.
        let exe = std::path::PathBuf::from(format!("/proc/{pid}/exe"));
        if !libs && !crate::session::uprobe::is_static(&exe) {
            self.seen.remove(&pid);
            return None;
        }
        self.objects.insert(key);
        self.probe_allocator(pid, None)
    }

    /// Uprobes on the allocator `pid` maps, for every process that maps it
    /// or for `only` (None, said, when it cannot be probed).
    pub(super) fn probe_allocator(&mut self, pid: u32, only: Option<u32>) -> Option<Vec<Probe>> {
        let at = Points {
            running: Some(pid),
            only,
            session: true,
            ..Default::default()
        };
        match points::user(&at) {
            Ok(p) => {
                self.note(&p);
                Some(p.probes)
            }
            Err(e) => {
                self.unprobed += 1;
                let name = crate::process::proc::comm(pid).unwrap_or_default();
                say!("memtrace: warning: --heap: PID {pid} ({name}): its heap is not seen: {e}");
                None
            }
        }
    }

    /// Attaches the probes taken for `pid`. One that fails because `pid`
    /// exited meanwhile (an OOM kill, a short life) is no error: nothing
    /// more of it is to be seen, and it is counted.
    pub(super) fn attach_for(&mut self, s: &mut Traced, pid: u32, probes: &[Probe]) -> Result<()> {
        for p in probes {
            if let Err(e) = s.attach(p) {
                if !crate::process::proc::exited(pid) {
                    return Err(e);
                }
                self.gone_before_probes += 1;
                return Ok(());
            }
        }
        Ok(())
    }

    pub(super) fn note(&mut self, p: &points::Probed) {
        if let Some(o) = &p.object {
            self.probed.push(o.clone());
            self.arenas.extend(points::arena_name(o));
        }
    }

    /// Takes in the processes of `pids` not seen yet: their maps read (for
    /// their stacks after they are gone), and their allocator probed if it
    /// is a new one. (The programs see a process from the moment it is in
    /// a watched group: this only reads.)
    /// With `settle`, a process is taken in at the second look that finds
    /// it: on a host starting thousands a second, the short-lived ones are
    /// never read (their stacks symbolize from the mappings the kernel
    /// reports at their exec).
    pub fn follow(&mut self, s: &mut Traced, pids: &[u32], settle: bool) -> Result<()> {
        let before = std::mem::take(&mut self.candidates);
        for &pid in pids {
            if self.seen.contains(&pid) {
                continue;
            }
            if settle && !before.contains(&pid) {
                self.candidates.insert(pid);
                continue;
            }
            if self.shim.is_some() && self.too_young(pid) {
                continue;
            }
            self.seen.insert(pid);
            // The maps read once: kept for its stacks, and its allocator's key.
            let maps = {
                let mut cache = s.sym.maps.lock().unwrap();
                cache.snapshot(pid);
                cache.maps(pid).map(<[Mapping]>::to_vec)
            };
            let Some(maps) = maps else { continue };
            // A Go program without a C library has no allocator but Go's,
            // read from its profile: nothing to probe or load.
            self.go.turn_on = self.shim.is_some();
            if self.go.take(pid, &maps) && allocator_key(&maps).is_some_and(|k| !k.1) {
                continue;
            }
            if self.shim.is_some() {
                self.follow_shim(s, pid, &maps)?;
                continue;
            }
            if let Some(probes) = self.allocator_of(pid, &maps) {
                self.attach_for(s, pid, &probes)?;
                if let Some(o) = self.probed.last() {
                    say!("memtrace: --heap: PID {pid} maps another allocator, {o}: probed too");
                }
            }
        }
        Ok(())
    }
}
