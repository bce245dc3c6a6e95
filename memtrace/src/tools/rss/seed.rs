//! Who rss's rows are of. The kernel only sees changes: a process already
//! running when tracing starts has a row only once a counter of its changes,
//! and then only that counter. So each process is seeded from /proc when it
//! is first met (the target and its existing descendants at start, a new
//! child at its first row), keeping the counters the kernel has written
//! since. Each is known by pid and start time: a pid reused by a process
//! that is no descendant is told apart, never listed nor summed.

use std::collections::HashMap;

use memtrace_common::names;
use memtrace_common::rss::{RssVal, ANON, FILE, NR, SHMEM, SWAP};

use crate::error::Result;
use crate::process::proc;
use crate::stacks::Traced;

/// The counters of `pid` now, from /proc/PID/status, as the kernel keeps them.
pub fn seed(pid: u32) -> Option<RssVal> {
    let st = proc::status(pid)?;
    let mut v = RssVal::default();
    v.bytes[FILE] = st.rss_file;
    v.bytes[ANON] = st.rss_anon;
    v.bytes[SHMEM] = st.rss_shmem;
    v.bytes[SWAP] = st.swap;
    v.peak = (v.bytes[FILE] + v.bytes[ANON] + v.bytes[SHMEM]).max(0) as u64;
    let name = crate::process::proc::comm(pid).unwrap_or_default();
    for (d, s) in v.comm.iter_mut().zip(name.bytes().take(15)) {
        *d = s;
    }
    Some(v)
}

/// `BPF_NOEXIST` (uapi/linux/bpf.h): insert only if the key is absent.
pub const BPF_NOEXIST: u64 = 1;

/// `BPF_EXIST` (uapi/linux/bpf.h): update only if the key is present.
const BPF_EXIST: u64 = 2;

/// What a row read from the kernel is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// A process listed before, still the same.
    Ours,
    /// A listed process that exited, or whose pid another process took.
    Gone { reused: bool },
    /// A followed process not met yet (forked since): to seed.
    New,
    /// No process of ours (a pid reused before memtrace unfollowed it).
    Stranger,
}

/// The processes listed, by pid, with their start time.
#[derive(Default)]
pub struct Born(pub HashMap<u32, u64>);

impl Born {
    pub fn fate(&self, pid: u32, target: u32, followed: bool) -> Fate {
        match self.0.get(&pid) {
            // The target's last state is what the final report is for.
            Some(_) if pid == target => Fate::Ours,
            // One read of /proc/PID/stat a row and interval.
            Some(b) => match proc::started_and_exiting(pid) {
                Some((t, false)) if t == *b => Fate::Ours,
                Some((t, _)) => Fate::Gone { reused: t != *b },
                None => Fate::Gone { reused: false },
            },
            None if followed || pid == target => Fate::New,
            None => Fate::Stranger,
        }
    }

    /// Seeds `pid`'s row with what /proc says, keeping the counters the
    /// kernel has written since it attached (they are newer); `adjust`
    /// sees the seed first (the threshold at start). False if the process
    /// is gone.
    pub fn seed_into(
        &mut self,
        s: &mut Traced,
        pid: u32,
        adjust: impl FnOnce(&mut RssVal),
    ) -> Result<bool> {
        let (Some(mut v), Some(t)) = (seed(pid), proc::start_time(pid)) else {
            return Ok(false);
        };
        adjust(&mut v);
        s.hash_insert(names::RSS, pid, v, BPF_NOEXIST)?;
        if let Some(mut k) = s.hash_get(names::RSS, &pid).filter(|k| k.set != 0) {
            for i in 0..NR {
                if k.set & (1 << i) == 0 {
                    k.bytes[i] = v.bytes[i];
                }
            }
            let rss = (k.bytes[FILE] + k.bytes[ANON] + k.bytes[SHMEM]).max(0) as u64;
            k.peak = k.peak.max(rss);
            k.crossed |= v.crossed;
            // A change between the read and this write is replaced by the
            // next change of that counter, as in the kernel's own races.
            s.hash_insert(names::RSS, pid, k, BPF_EXIST)?;
        }
        self.0.insert(pid, t);
        Ok(true)
    }
}
