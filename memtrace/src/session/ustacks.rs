//! Walked user stacks taken out of the kernel's map (USTACKS): each is
//! read and deleted in one call, and the programs only insert where an id
//! is free, so no stack stored meanwhile is lost. What is kept of them, and
//! for how long, is the stacks wing's (`stacks::store`).

use aya::maps::HashMap as AyaHashMap;
use memtrace_common::{names, stacks::UserStack};

use super::maps::{take, KnownSizes};
use super::{chain, Session};
use crate::error::{Error, Result};

impl Session {
    /// Every walked user stack that arrived since the last call, taken out
    /// of USTACKS and handed to `each` one at a time (a harvest can bring
    /// 16,384 of a KiB each: collected, they were 16 MiB at once); how
    /// many. None when the object has no such map.
    pub fn take_user_stacks(&mut self, mut each: impl FnMut(u64, &UserStack)) -> Result<usize> {
        let Some(m) = self.bpf.map(names::USTACKS.name) else {
            return Ok(0);
        };
        let h =
            AyaHashMap::<_, u64, UserStack>::try_from(m).map_err(|e| Error::Runtime(chain(&e)))?;
        let keys: Vec<u64> = h.keys().filter_map(|k| self.counted(k)).collect();
        let fd = KnownSizes::<u64, UserStack>::of(m)?;
        let mut n = 0;
        for key in keys {
            let s = match take(&fd, &key, 1) {
                Ok(Some(mut v)) => v.pop(),
                Ok(None) => None,
                // Kernels before 5.14: read, then delete.
                Err(_) => {
                    let m = self
                        .bpf
                        .map_mut(names::USTACKS.name)
                        .expect("map seen above");
                    let mut h = AyaHashMap::<_, u64, UserStack>::try_from(m)
                        .map_err(|e| Error::Runtime(chain(&e)))?;
                    let s = h.get(&key, 0).ok();
                    let _ = h.remove(&key);
                    s
                }
            };
            if let Some(s) = s {
                each(key, &s);
                n += 1;
            }
        }
        Ok(n)
    }
}
