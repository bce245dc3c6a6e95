//! Moving the program break: through glibc's sbrk, and by brk(2) issued
//! here (frame-pointer stacks start in this code), at depths a stack walk
//! must cope with.

use std::hint::black_box;

#[inline(never)]
pub(crate) fn grow_heap_with_sbrk(n: usize, size: isize) {
    for _ in 0..n {
        // SAFETY: sbrk only moves the break; nothing uses the memory.
        unsafe { black_box(libc::sbrk(size)) };
    }
}

/// brk(2) issued from this function itself (inline asm), so a frame-pointer
/// stack starts here rather than inside glibc, which has no frame pointers.
#[inline(never)]
pub(crate) fn grow_heap_with_raw_brk(n: usize, size: u64) {
    let brk = |addr: u64| crate::raw::syscall1(libc::SYS_brk, addr) as u64;
    let mut cur = brk(0);
    for _ in 0..n {
        cur = brk(cur + size);
    }
    black_box(cur);
}

/// `grow_heap_with_raw_brk` below `depth` frames of recursion: a stack
/// deeper than the walk keeps.
#[inline(never)]
pub(crate) fn raw_brk_deep(depth: usize, n: usize) {
    if depth == 0 {
        grow_heap_with_raw_brk(n, 4096);
        return;
    }
    raw_brk_deep(depth - 1, n);
    // Work after the call: no tail call, every level keeps its frame.
    black_box(depth);
}

/// The same with 1 KiB frames: a stack longer than the pages the walk
/// copies, in fewer frames than it keeps.
#[inline(never)]
pub(crate) fn raw_brk_deep_wide(depth: usize, n: usize) {
    let mut pad = [0u8; 1024];
    black_box(&mut pad);
    if depth == 0 {
        grow_heap_with_raw_brk(n, 4096);
        return;
    }
    raw_brk_deep_wide(depth - 1, n);
    black_box(&pad);
}
