//! Blocks of a process image that exec'd away: its memory is gone with it,
//! so they are taken out of the live table, and out of their stacks'
//! outstanding figures here (a wrapper script's shell, say, that execs the
//! program: its allocations are not the program's, nor held).

use std::collections::{HashMap, HashSet};

use memtrace_common::{names::ML_EXECS, stacks::StackKey};

use super::report::Tables;
use crate::error::Result;
use crate::stacks::Traced;

#[derive(Default)]
pub struct Execs {
    /// Per stack: (allocations, bytes) that went with an exec.
    pub gone: HashMap<StackKey, (u64, u64)>,
    blocks: u64,
    /// The inode of the static program whose own allocator is probed.
    pub probed: Option<u64>,
    /// Static programs already named.
    said: HashSet<u64>,
}

impl Execs {
    /// Takes out the blocks made before each exec the kernel noted; the
    /// processes that exec'd, with when.
    pub fn sweep(&mut self, s: &mut Traced, t: Tables) -> Result<HashMap<u32, u64>> {
        let execs = s.hash_entries(ML_EXECS);
        if execs.is_empty() {
            return Ok(HashMap::new());
        }
        for (tgid, _) in &execs {
            s.hash_remove(ML_EXECS, tgid)?;
        }
        let when: HashMap<u32, u64> = execs.into_iter().collect();
        self.say_static(s, when.keys().copied());
        for (k, a) in s.hash_entries(t.allocs) {
            // The old image cannot allocate after its exec: anything older
            // than it from that process was the old image's.
            if when.get(&k.tgid).is_some_and(|&at| a.ts_ns < at) {
                s.hash_remove(t.allocs, &k)?;
                let g = self.gone.entry(a.stack).or_default();
                g.0 += a.weight;
                g.1 += a.weight_bytes;
                self.blocks += 1;
            }
        }
        Ok(when)
    }

    /// A process that exec'd a statically linked program other than the
    /// one probed (a shell line's): no shim loads into it and its own
    /// allocator has no probe, so its blocks go unseen. Said once a program.
    fn say_static(&mut self, s: &Traced, tgids: impl Iterator<Item = u32>) {
        let maps = s.sym.maps.lock().unwrap();
        for tgid in tgids {
            let Some(m) = maps.maps(tgid) else { continue };
            // A static image is its program's code alone (and the vdso's).
            let code: Vec<_> = m
                .iter()
                .filter(|m| m.perms.contains('x') && m.inode != 0)
                .collect();
            let [image] = code[..] else { continue };
            if Some(image.inode) == self.probed || self.said.contains(&image.inode) {
                continue;
            }
            let file = maps
                .file(image)
                .or_else(|| image.open_in(tgid).ok().map(std::sync::Arc::new));
            if file.is_some_and(|f| crate::session::uprobe::is_static_file(&f)) {
                self.said.insert(image.inode);
                say!(
                    "memtrace: warning: PID {tgid} runs {}, which is statically linked: \
                     its own allocator is not probed, so its blocks are not seen \
                     (run it as the command itself, -c '{} ...', or with -p)",
                    image.path,
                    image.path
                );
            }
        }
    }

    pub fn blocks(&self) -> u64 {
        self.blocks
    }
}
