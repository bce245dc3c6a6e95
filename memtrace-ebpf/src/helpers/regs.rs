//! A probed function's registers, by architecture: its arguments, its
//! stack pointer and its return value (aya's own readers are private).

use aya_ebpf::bindings::{bpf_perf_event_data, pt_regs};

/// The registers a uprobe saw.
pub struct Regs(pub *const pt_regs);

#[cfg(bpf_target_arch = "x86_64")]
impl Regs {
    /// Argument `i` (0-based) of the System V calling convention.
    #[inline(always)]
    pub fn arg(&self, i: usize) -> u64 {
        let r = unsafe { &*self.0 };
        match i {
            0 => r.rdi,
            1 => r.rsi,
            2 => r.rdx,
            3 => r.rcx,
            4 => r.r8,
            _ => r.r9,
        }
    }

    #[inline(always)]
    pub fn sp(&self) -> u64 {
        unsafe { (*self.0).rsp }
    }

    #[inline(always)]
    pub fn ip(&self) -> u64 {
        unsafe { (*self.0).rip }
    }

    #[inline(always)]
    pub fn ret(&self) -> u64 {
        unsafe { (*self.0).rax }
    }

    /// At a function's return, its stack pointer at entry (the return
    /// address popped).
    #[inline(always)]
    pub fn entry_sp(&self) -> u64 {
        self.sp().wrapping_sub(8)
    }
}

/// arm64's `struct pt_regs` begins with `user_pt_regs`: x0..x30, sp, pc,
/// pstate (the bindings leave it opaque).
#[cfg(bpf_target_arch = "aarch64")]
impl Regs {
    #[inline(always)]
    fn word(&self, i: usize) -> u64 {
        unsafe { *(self.0 as *const u64).add(i) }
    }

    /// Argument `i` (0-based): x0..x7.
    #[inline(always)]
    pub fn arg(&self, i: usize) -> u64 {
        self.word(i.min(7))
    }

    #[inline(always)]
    pub fn sp(&self) -> u64 {
        self.word(31)
    }

    #[inline(always)]
    pub fn ip(&self) -> u64 {
        self.word(32)
    }

    #[inline(always)]
    pub fn ret(&self) -> u64 {
        self.word(0)
    }

    /// At a function's return, its stack pointer at entry (the return
    /// address was in x30, never on the stack).
    #[inline(always)]
    pub fn entry_sp(&self) -> u64 {
        self.sp()
    }
}

/// Whether a perf event's sample was taken in user mode: the saved code
/// segment's privilege level (x86), the saved exception level (arm64).
#[inline(always)]
pub fn perf_in_user_mode(data: *const bpf_perf_event_data) -> bool {
    #[cfg(bpf_target_arch = "x86_64")]
    let user = unsafe { (*data).regs.cs } & 3 != 0;
    #[cfg(bpf_target_arch = "aarch64")]
    let user = unsafe { (*data).regs.pstate } & 0xf == 0;
    user
}
