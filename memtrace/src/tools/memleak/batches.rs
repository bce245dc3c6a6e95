//! What the shim's threads hold in their batches (memtrace/preload/frees.c)
//! when a report is made, read from the processes (the kernel keeps each
//! thread's batch address): frees, so that a report taken while a thread
//! idles after freeing does not show those blocks as held, and
//! allocations whose stack came from the memo, which are. The kernel
//! applies them when the batch is reported; only the report counts them
//! now. A free pending in one thread may be of a block whose allocation is
//! pending in another's, or whose free the kernel already holds
//! (`ML_EARLY_FREES`): such a block is not held.

use std::collections::HashMap;

use memtrace_common::memleak::{AllocKey, BATCH_ENTRIES_AT, FREE_BATCH};
use memtrace_common::names::{ML_BATCHES, ML_EARLY_FREES};
use memtrace_common::shim::{entry_key, BatchEntry, ALLOCATED};
use memtrace_common::stacks::StackKey;

use crate::stacks::Traced;

/// An allocation in a batch: its stack, address, time and size.
pub type PendingBlock = (StackKey, u64, u64, u64);

#[derive(Default)]
pub struct Pending {
    /// (process, address, time of the free) of the frees not matched to a
    /// pending allocation.
    pub frees: Vec<(u32, u64, u64)>,
    /// The allocations still held.
    pub allocs: Vec<PendingBlock>,
    /// Frees in batches, all of them.
    pub nr_frees: u64,
}

pub fn pending(s: &Traced) -> Pending {
    let mut frees = Vec::new();
    let mut allocs: Vec<Option<PendingBlock>> = Vec::new();
    for (tid, at) in s.hash_entries(ML_BATCHES) {
        let Some(tgid) = crate::process::proc::tgid_of(tid) else {
            continue;
        };
        let mut n = [0u8; 4];
        if read(tid, at, &mut n).is_none() {
            continue;
        }
        let n = u32::from_ne_bytes(n).min(FREE_BATCH) as usize;
        let size = std::mem::size_of::<BatchEntry>();
        let mut buf = vec![0u8; n * size];
        if read(tid, at + BATCH_ENTRIES_AT, &mut buf).is_none() {
            continue;
        }
        for e in buf.chunks_exact(size) {
            let word = |i: usize| u64::from_ne_bytes(e[i * 8..i * 8 + 8].try_into().unwrap());
            let (addr, ts, bytes, stack) = (word(0), word(1), word(2), word(3));
            if stack & ALLOCATED == 0 {
                frees.push((tgid, addr, ts));
            } else if addr != 0 {
                allocs.push(Some((entry_key(tgid, stack), addr, ts, bytes)));
            }
        }
    }
    let nr_frees = frees.len() as u64;
    // By block: the pending allocations there, oldest first.
    let mut at: HashMap<(u32, u64), Vec<usize>> = HashMap::new();
    allocs.sort_by_key(|a| a.map(|a| a.2));
    for (i, a) in allocs.iter().enumerate() {
        if let Some((k, addr, _, _)) = a {
            at.entry((k.tgid, *addr)).or_default().push(i);
        }
    }
    // A free takes the newest pending allocation made before it.
    frees.retain(|&(tgid, addr, ts)| {
        let Some(idx) = at.get(&(tgid, addr)) else {
            return true;
        };
        let newest = idx
            .iter()
            .rev()
            .find(|&&i| allocs[i].is_some_and(|a| a.2 <= ts));
        match newest {
            Some(&i) => {
                allocs[i] = None;
                false
            }
            None => true,
        }
    });
    // Frees the kernel keeps for allocations still in batches: each takes
    // the first such allocation at or before it, as the kernel will.
    for (k, times) in s.hash_entries(ML_EARLY_FREES) {
        let AllocKey { addr, tgid, .. } = k;
        let mut times: Vec<u64> = times.into_iter().filter(|&t| t != 0).collect();
        times.sort_unstable();
        for &i in at.get(&(tgid, addr)).into_iter().flatten() {
            let Some(a) = allocs[i] else { continue };
            if let Some(j) = times.iter().position(|&t| t >= a.2) {
                times.remove(j);
                allocs[i] = None;
            }
        }
    }
    Pending {
        frees,
        allocs: allocs.into_iter().flatten().collect(),
        nr_frees,
    }
}

/// `buf.len()` bytes of thread `tid`'s memory at `at`, whole or None.
fn read(tid: u32, at: u64, buf: &mut [u8]) -> Option<()> {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: at as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: one local buffer of the given length.
    let n = unsafe { libc::process_vm_readv(tid as i32, &local, 1, &remote, 1, 0) };
    (n == buf.len() as isize).then_some(())
}
