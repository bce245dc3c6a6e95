//! A Rust workload built without frame pointers (`-C force-frame-pointers=no`),
//! compiled by the tests with plain rustc: its stacks are complete only when
//! unwound with .eh_frame. Each call chain is three named functions deep.

use std::hint::black_box;

unsafe extern "C" {
    fn sbrk(increment: isize) -> *mut u8;
    fn mmap(addr: *mut u8, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> *mut u8;
    fn madvise(addr: *mut u8, len: usize, advice: i32) -> i32;
}

const PAGE: usize = 4096;

/// `n` fresh anonymous pages written once each: one fault per page.
#[inline(never)]
fn rust_touch_inner(n: usize) {
    // PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, MADV_NOHUGEPAGE.
    // SAFETY: a new private mapping, written inside its bounds.
    unsafe {
        let p = mmap(std::ptr::null_mut(), n * PAGE, 3, 0x22, -1, 0);
        if p as isize == -1 {
            std::process::exit(1);
        }
        madvise(p, n * PAGE, 15);
        for i in 0..n {
            std::ptr::write_volatile(p.add(i * PAGE), 1);
        }
    }
    black_box(());
}

#[inline(never)]
fn rust_touch_middle(n: usize) {
    rust_touch_inner(black_box(n));
    black_box(());
}

#[inline(never)]
fn rust_touch_outer(n: usize) {
    rust_touch_middle(black_box(n));
    black_box(());
}

#[inline(never)]
fn rust_heap_grow_inner(n: usize) {
    for _ in 0..n {
        // SAFETY: growing the break by a page; the memory is never used.
        if unsafe { sbrk(4096) } as isize == -1 {
            std::process::exit(1);
        }
    }
    black_box(());
}

// black_box after each call keeps it out of tail position.
#[inline(never)]
fn rust_heap_grow_middle(n: usize) {
    rust_heap_grow_inner(black_box(n));
    black_box(());
}

#[inline(never)]
fn rust_heap_grow_outer(n: usize) {
    rust_heap_grow_middle(black_box(n));
    black_box(());
}

fn main() {
    // `touch N`: N page faults; otherwise `N`: N sbrk calls.
    if std::env::args().nth(1).as_deref() == Some("touch") {
        let n = std::env::args()
            .nth(2)
            .and_then(|a| a.parse().ok())
            .unwrap_or(10);
        rust_touch_outer(n);
        return;
    }
    let n = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10);
    // `N MS`: wait MS first, so a tracer that reads the new image's maps
    // a while after the exec has them before the calls.
    if let Some(ms) = std::env::args().nth(2).and_then(|a| a.parse().ok()) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    rust_heap_grow_outer(n);
}
