//! Workloads with known rates and counts for `top` and `serve`.

use std::time::{Duration, Instant};

use crate::PAGE;

fn fresh_region(pages: usize) -> *mut u8 {
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            pages.max(1) * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert!(p != libc::MAP_FAILED, "mmap");
    // Exact counts need one fault per 4 KiB page.
    unsafe { libc::madvise(p, pages.max(1) * PAGE, libc::MADV_NOHUGEPAGE) };
    p as *mut u8
}

/// What a workload sets up before `--wait` returns, so that only the
/// counted work comes after: its region and the current break.
pub struct Pre {
    region: *mut u8,
    brk: u64,
}

/// For `paced` and `counted` (`args` may start with `--wait`).
pub fn prepare(args: &[String]) -> Option<Pre> {
    let a: Vec<&str> = args
        .iter()
        .map(|s| s.as_str())
        .skip_while(|s| *s == "--wait")
        .collect();
    let num = |i: usize| a.get(i).and_then(|s| s.parse::<usize>().ok()).unwrap_or(0);
    let pages = match a.first() {
        Some(&"paced") => num(1) * num(3),
        Some(&"counted") => num(1),
        _ => return None,
    };
    Some(Pre {
        region: fresh_region(pages),
        brk: unsafe { libc::syscall(libc::SYS_brk, 0u64) } as u64,
    })
}

/// One brk(2) growing the heap by `by` bytes, issued here (inline asm):
/// no glibc frame without frame pointers hides this one from a stack walk.
#[inline(never)]
fn raw_brk(cur: &mut u64, by: u64) {
    *cur = crate::raw::syscall1(libc::SYS_brk, *cur + by) as u64;
}

/// `paced FAULTS_PER_S BRKS_PER_S SECS`: every 10 ms, a hundredth of each
/// rate: fresh pages touched (one fault each) and brk calls growing the
/// heap by a page. The region is mapped before `--wait` returns, so only
/// the paced faults and brk calls come after.
pub fn paced(faults: usize, brks: usize, secs: u64, pre: Pre) {
    let (region, mut cur) = (pre.region, pre.brk);
    let ticks = secs * 100;
    let start = Instant::now();
    let (mut touched, mut called) = (0usize, 0usize);
    for t in 1..=ticks {
        // Catch up to where the rate should be: sleeps drift, rates don't.
        let want_f = faults * t as usize / 100;
        let want_b = brks * t as usize / 100;
        while touched < want_f {
            unsafe { std::ptr::write_volatile(region.add(touched * PAGE), 1) };
            touched += 1;
        }
        while called < want_b {
            raw_brk(&mut cur, PAGE as u64);
            called += 1;
        }
        let next = start + Duration::from_millis(t * 10);
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
    }
}

/// `counted PAGES MMAPS BRKS`: PAGES fresh pages touched (in a region
/// mapped before `--wait` returns), MMAPS mmap calls of 8 KiB each (not
/// touched, not unmapped) and BRKS brk calls growing the heap by a page.
pub fn counted(pages: usize, mmaps: usize, brks: usize, pre: Pre) {
    let (region, mut cur) = (pre.region, pre.brk);
    for i in 0..pages {
        unsafe { std::ptr::write_volatile(region.add(i * PAGE), 1) };
    }
    for _ in 0..mmaps {
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * PAGE,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(p != libc::MAP_FAILED);
    }
    for _ in 0..brks {
        raw_brk(&mut cur, PAGE as u64);
    }
}
