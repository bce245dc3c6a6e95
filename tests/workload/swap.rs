//! `swap MIB`: anonymous pages pushed out to swap, then read back, with the
//! exact number of pages that must come back from the swap device.
//!
//! Run it in a memory cgroup whose limit is below MIB. It touches MIB MiB,
//! which the cgroup's reclaim swaps partly out, and says `touched N`; waits
//! for a line on stdin (the caller lifts the limit meanwhile, so nothing is
//! pushed out any more); counts the pages that are in swap and not in the
//! swap cache, since only those need a read from the device; reads every
//! page, checking its content, and prints `swapped K of N`, `retouched N`.
//! Its other pages are locked in memory, so K is exactly the swap-ins to
//! expect.

use std::hint::black_box;
use std::io::{BufRead, Read, Seek, SeekFrom, Write};

use crate::{map_anon, PAGE};

/// Pagemap entry bit: the page is in swap (its PTE is a swap entry).
const PM_SWAP: u64 = 1 << 62;

/// How many of the `n` pages at `p` are in swap and not resident: the pages
/// whose next touch reads the swap device. mincore(2) reports a swapped page
/// that is still in the swap cache as resident; touching it reads nothing.
fn swapped_out(p: *mut u8, n: usize) -> usize {
    let mut pagemap = std::fs::File::open("/proc/self/pagemap").expect("open pagemap");
    pagemap
        .seek(SeekFrom::Start((p as u64 / PAGE as u64) * 8))
        .unwrap();
    let mut raw = vec![0u8; n * 8];
    pagemap.read_exact(&mut raw).expect("read pagemap");
    let mut resident = vec![0u8; n];
    // SAFETY: `p` is our mapping of `n` pages; `resident` has n bytes.
    let r = unsafe { libc::mincore(p as *mut libc::c_void, n * PAGE, resident.as_mut_ptr()) };
    assert_eq!(r, 0, "mincore failed");
    raw.chunks_exact(8)
        .zip(&resident)
        .filter(|(e, res)| {
            let e = u64::from_le_bytes((*e).try_into().unwrap());
            e & PM_SWAP != 0 && *res & 1 == 0
        })
        .count()
}

pub fn swap(mib: usize) {
    // Everything the process has before its region stays in memory: stack,
    // heap, data and the stdio buffers made here (MCL_CURRENT; the region
    // comes later). Otherwise a few dozen of those pages are swapped out
    // too and read back, beyond the region's count.
    let mut out = std::io::stdout();
    let input = std::io::stdin();
    let mut line = String::with_capacity(64);
    // SAFETY: no pointers.
    assert_eq!(unsafe { libc::mlockall(libc::MCL_CURRENT) }, 0, "mlockall");
    let n = (mib << 20) / PAGE;
    let p = map_anon(n * PAGE);
    // Distinct content per page: zram keeps same-filled pages without
    // compressing them, and the check below sees any page swapped in wrong.
    for i in 0..n {
        // SAFETY: inside the mapping, 8-byte aligned.
        unsafe { std::ptr::write_volatile(p.add(i * PAGE) as *mut u64, i as u64 + 1) };
    }
    writeln!(out, "touched {n}").unwrap();
    out.flush().unwrap();
    // End of input counts as the go-ahead too.
    let _ = input.lock().read_line(&mut line);
    // Counted only now that the limit is gone: anything charged while at
    // the limit (even the line above, written to a tmpfs file) would push
    // more pages out after the count.
    let k = swapped_out(p, n);
    let mut bad = 0;
    for i in 0..n {
        // SAFETY: as above.
        let v = unsafe { std::ptr::read_volatile(p.add(i * PAGE) as *const u64) };
        bad += (v != i as u64 + 1) as usize;
    }
    black_box(p);
    assert_eq!(bad, 0, "{bad} pages came back from swap with wrong content");
    writeln!(out, "swapped {k} of {n}").unwrap();
    writeln!(out, "retouched {n}").unwrap();
}
