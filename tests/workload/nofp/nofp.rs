//! A Rust workload built without frame pointers (`-C force-frame-pointers=no`),
//! compiled by the tests with plain rustc: its stacks are complete only when
//! unwound with .eh_frame. Each call chain is three named functions deep.

use std::hint::black_box;

unsafe extern "C" {
    fn sbrk(increment: isize) -> *mut u8;
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
    let n = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10);
    rust_heap_grow_outer(n);
}
