//! A stopped thread's program counter through ptrace, and the breakpoint
//! that stops it, by architecture.

use std::io;

use libc::pid_t;

/// `word` (read at an instruction) with its first instruction replaced by
/// a breakpoint: x86-64's int3, arm64's `brk #0`.
pub fn with_breakpoint(word: u64) -> u64 {
    if cfg!(target_arch = "aarch64") {
        (word & !0xffff_ffff) | 0xd420_0000
    } else {
        (word & !0xff) | 0xcc
    }
}

/// How far past a breakpoint that trapped the program counter is: int3
/// has run, `brk` has not.
pub const PC_PAST_BREAKPOINT: u64 = if cfg!(target_arch = "aarch64") { 0 } else { 1 };

/// The general registers (`NT_PRSTATUS`, the request both architectures
/// have).
fn regs(tid: pid_t) -> io::Result<libc::user_regs_struct> {
    // SAFETY: a plain register structure, filled by the kernel.
    let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    let mut iov = libc::iovec {
        iov_base: (&mut r as *mut libc::user_regs_struct).cast(),
        iov_len: std::mem::size_of_val(&r),
    };
    // SAFETY: the kernel writes at most iov_len bytes into `r`.
    let rc = unsafe { libc::ptrace(libc::PTRACE_GETREGSET, tid, libc::NT_PRSTATUS, &mut iov) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

#[cfg(target_arch = "x86_64")]
fn pc_of(r: &mut libc::user_regs_struct) -> &mut u64 {
    &mut r.rip
}

#[cfg(target_arch = "aarch64")]
fn pc_of(r: &mut libc::user_regs_struct) -> &mut u64 {
    &mut r.pc
}

/// Stopped thread `tid`'s program counter.
pub fn pc(tid: pid_t) -> io::Result<u64> {
    Ok(*pc_of(&mut regs(tid)?))
}

/// Stopped thread `tid`'s stack pointer.
pub fn sp(tid: pid_t) -> io::Result<u64> {
    let r = regs(tid)?;
    #[cfg(target_arch = "x86_64")]
    return Ok(r.rsp);
    #[cfg(target_arch = "aarch64")]
    return Ok(r.sp);
}

/// Moves stopped thread `tid`'s program counter to `at`.
pub fn set_pc(tid: pid_t, at: u64) -> io::Result<()> {
    let mut r = regs(tid)?;
    *pc_of(&mut r) = at;
    let mut iov = libc::iovec {
        iov_base: (&mut r as *mut libc::user_regs_struct).cast(),
        iov_len: std::mem::size_of_val(&r),
    };
    // SAFETY: the kernel reads iov_len bytes from `r`.
    let rc = unsafe { libc::ptrace(libc::PTRACE_SETREGSET, tid, libc::NT_PRSTATUS, &mut iov) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
