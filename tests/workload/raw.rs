//! System calls issued by inline asm in the calling function itself (these
//! are always inlined), so that a frame-pointer stack starts there rather
//! than inside glibc, which has no frame pointers. One per architecture.

/// `syscall(nr, a0)`; the raw result (a value or -errno).
#[inline(always)]
pub(crate) fn syscall1(nr: i64, a0: u64) -> i64 {
    syscall6(nr, [a0, 0, 0, 0, 0, 0])
}

/// `syscall(nr, a...)`; the raw result (a value or -errno).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn syscall6(nr: i64, a: [u64; 6]) -> i64 {
    let ret: i64;
    // SAFETY: the callers issue brk and anonymous mmap only.
    unsafe {
        std::arch::asm!("syscall", inlateout("rax") nr => ret,
            in("rdi") a[0], in("rsi") a[1], in("rdx") a[2], in("r10") a[3],
            in("r8") a[4], in("r9") a[5], lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret
}

/// `syscall(nr, a...)`; the raw result (a value or -errno).
#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub(crate) fn syscall6(nr: i64, a: [u64; 6]) -> i64 {
    let ret: i64;
    // SAFETY: the callers issue brk and anonymous mmap only.
    unsafe {
        std::arch::asm!("svc #0", in("x8") nr, inlateout("x0") a[0] as i64 => ret,
            in("x1") a[1], in("x2") a[2], in("x3") a[3], in("x4") a[4], in("x5") a[5],
            options(nostack));
    }
    ret
}
