//! Frees the shim's threads hold in batches (memtrace/preload/frees.c)
//! when a report is made: read from the processes (the kernel keeps each
//! thread's batch address), so that a report taken while a thread idles
//! after freeing does not show those blocks as held. The kernel applies
//! them when the batch is reported; only the report discounts them now.

use memtrace_common::memleak::{BatchedFree, BATCH_ENTRIES_AT, FREE_BATCH};
use memtrace_common::names::ML_BATCHES;

use crate::stacks::Traced;

/// (process, address, time of the free) of every pending free.
pub fn pending(s: &Traced) -> Vec<(u32, u64, u64)> {
    let mut out = Vec::new();
    for (tid, at) in s.hash_entries(ML_BATCHES) {
        let Some(tgid) = crate::process::proc::tgid_of(tid) else {
            continue;
        };
        let mut n = [0u8; 4];
        if read(tid, at, &mut n).is_none() {
            continue;
        }
        let n = u32::from_ne_bytes(n).min(FREE_BATCH) as usize;
        let size = std::mem::size_of::<BatchedFree>();
        let mut buf = vec![0u8; n * size];
        if read(tid, at + BATCH_ENTRIES_AT, &mut buf).is_none() {
            continue;
        }
        for e in buf.chunks_exact(size) {
            let word = |i: usize| u64::from_ne_bytes(e[i..i + 8].try_into().unwrap());
            out.push((tgid, word(0), word(8)));
        }
    }
    out
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
