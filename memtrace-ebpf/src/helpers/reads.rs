//! Reads of kernel memory at offsets userspace resolved from BTF (Rust eBPF
//! has no CO-RE): task and mm fields, cgroup ids, a file behind an fd, and
//! tracepoint fields, every failure counted.

use aya_ebpf::{
    cty::c_void,
    helpers::{
        bpf_get_current_task, bpf_probe_read_kernel,
        generated::{
            bpf_get_current_task_btf, bpf_probe_read_kernel as bpf_probe_read_kernel_raw,
            bpf_task_pt_regs,
        },
    },
    programs::TracePointContext,
    Global,
};
use memtrace_common::{loss, snoop::FdFileOffsets, stacks::UstackConfig, TaskOffsets};

use super::emit::count_loss;

#[unsafe(no_mangle)]
pub static TASK: Global<TaskOffsets> = Global::new(TaskOffsets {
    pid: 0,
    tgid: 0,
    comm: 0,
    mm: 0,
    cgroups: 0,
    css_set_subsys: 0,
    memory_cgrp_id: 0,
    css_cgroup: 0,
    cgroup_kn: 0,
    kernfs_node_id: 0,
    mm_rss_stat: 0,
    mm_total_vm: 0,
    mm_brk: 0,
    rss_stride: 0,
    rss_count: 0,
    task_cred: 0,
    cred_uid: 0,
    task_signal: 0,
    signal_oom_score_adj: 0,
    page_kb: 4,
    valid: 0,
});

/// A tracepoint field at `off` (from the format file); zero, counted as a
/// failed read, when it cannot be read.
#[inline(always)]
pub fn tp_field<T: Copy + Default>(ctx: &TracePointContext, off: u32) -> T {
    match unsafe { ctx.read_at::<T>(off as usize) } {
        Ok(v) => v,
        Err(_) => {
            count_loss(loss::READ);
            T::default()
        }
    }
}

/// Loads a `T` at `base + off` straight from kernel memory, without a
/// helper call. `base` must be a BTF-typed pointer (from a `_btf` helper or a
/// field loaded through one) and `off` a verifier constant (a frozen
/// `.rodata` global): the verifier checks the access against the kernel's
/// BTF, and a fault reads as zero.
#[inline(always)]
unsafe fn load<T: Copy>(base: *const u8, off: u32) -> T {
    unsafe { core::ptr::read_volatile(base.add(off as usize) as *const T) }
}

/// A field of a task (or of what it points to) at `off`, for reads on
/// every event: loaded straight from a BTF-typed pointer (`load`), or read
/// by helper on kernels before 5.11, whose tasks are not BTF-typed.
#[cfg(not(feature = "compat"))]
#[inline(always)]
pub(super) unsafe fn field<T: Copy>(base: *const u8, off: u32) -> T {
    unsafe { load(base, off) }
}

#[cfg(feature = "compat")]
#[inline(always)]
pub(super) unsafe fn field<T: Copy>(base: *const u8, off: u32) -> T {
    unsafe { read0(base, off) }
}

/// The current task, for `field`.
#[cfg(not(feature = "compat"))]
#[inline(always)]
pub(super) fn current_task_typed() -> *const u8 {
    unsafe { bpf_get_current_task_btf() as *const u8 }
}

#[cfg(feature = "compat")]
#[inline(always)]
pub(super) fn current_task_typed() -> *const u8 {
    current_task()
}

/// The current task's user ip, sp and bp, loaded from its saved registers
/// (each helper call costs tens of ns on a mitigated kernel: none here
/// but the two that find the registers).
#[inline(always)]
pub(super) fn user_regs(cfg: &UstackConfig) -> (u64, u64, u64) {
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const u8;
    unsafe {
        (
            load::<u64>(regs, cfg.regs_ip),
            load::<u64>(regs, cfg.regs_sp),
            load::<u64>(regs, cfg.regs_bp),
        )
    }
}

/// The current task's `mm_struct`, BTF-typed (null for kernel threads).
#[cfg(not(feature = "compat"))]
#[inline(always)]
fn current_mm() -> *const u8 {
    unsafe { load::<*const u8>(bpf_get_current_task_btf() as *const u8, TASK.load().mm) }
}

/// A `u64` field of the current task's `mm_struct`; 0 for kernel threads.
#[cfg(not(feature = "compat"))]
#[inline(always)]
pub fn current_mm_u64(off: u32) -> u64 {
    let mm = current_mm();
    if mm.is_null() {
        return 0;
    }
    unsafe { load::<u64>(mm, off) }
}

/// As above, by helper reads: kernels before 5.11 have no BTF-typed task.
#[cfg(feature = "compat")]
#[inline(always)]
pub fn current_mm_u64(off: u32) -> u64 {
    let mm = unsafe { read0::<*const u8>(current_task(), TASK.load().mm) };
    if mm.is_null() {
        return 0;
    }
    unsafe { read0::<u64>(mm, off) }
}

/// The current task's link register (arm64; x86-64's config points it at
/// rbp).
#[inline(always)]
pub(super) fn user_lr(cfg: &UstackConfig) -> u64 {
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const u8;
    unsafe { load::<u64>(regs, cfg.regs_lr) }
}

/// The main thread's stack top (`mm->start_stack`): stack copies stop there.
#[inline(always)]
pub(super) fn stack_top(cfg: &UstackConfig) -> u64 {
    current_mm_u64(cfg.mm_start_stack)
}

/// Reads a `T` at `base + off` in kernel memory.
#[inline(always)]
pub unsafe fn read<T>(base: *const u8, off: u32) -> Result<T, i32> {
    unsafe { bpf_probe_read_kernel(base.add(off as usize) as *const T) }
}

#[inline(always)]
pub fn current_task() -> *const u8 {
    unsafe { bpf_get_current_task() as *const u8 }
}

/// Reads a `T` at `base + off` in kernel memory; zero when that fails (the
/// helper zeroes it). No branch on the outcome: a chain of reads whose
/// failures lead nowhere else is cheap for the verifier to check (branching
/// on each made oomkill's program take 14 ms to load).
#[inline(always)]
pub unsafe fn read0<T: Copy>(base: *const u8, off: u32) -> T {
    let mut v = core::mem::MaybeUninit::<T>::uninit();
    unsafe {
        bpf_probe_read_kernel_raw(
            v.as_mut_ptr() as *mut c_void,
            core::mem::size_of::<T>() as u32,
            base.add(off as usize) as *const c_void,
        );
        v.assume_init()
    }
}

/// Kernfs id of the cgroup of `task`'s memory controller: the inode number of
/// its directory in the memory hierarchy (v1) or the unified one (v2).
#[inline(always)]
pub unsafe fn memcg_id(task: *const u8) -> u64 {
    let t = TASK.load();
    if t.valid == 0 {
        return 0;
    }
    unsafe {
        let cset = read0::<*const u8>(task, t.cgroups);
        css_cgroup_id(read0::<*const u8>(
            cset,
            t.css_set_subsys + t.memory_cgrp_id * 8,
        ))
    }
}

/// Kernfs id of the cgroup a `cgroup_subsys_state` belongs to.
#[inline(always)]
pub unsafe fn css_cgroup_id(css: *const u8) -> u64 {
    let t = TASK.load();
    unsafe {
        let cgrp = read0::<*const u8>(css, t.css_cgroup);
        let kn = read0::<*const u8>(cgrp, t.cgroup_kn);
        read0::<u64>(kn, t.kernfs_node_id)
    }
}

/// Device and inode of the current task's file `fd`, or (0, 0).
#[inline(always)]
pub fn fd_file(o: &FdFileOffsets, fd: u64) -> (u32, u64) {
    if o.valid == 0 || (fd as i32) < 0 {
        return (0, 0);
    }
    match fd_file_ptr(o, fd).and_then(|file| unsafe { file_id(o, file) }) {
        Ok(v) => v,
        Err(_) => {
            count_loss(loss::READ);
            (0, 0)
        }
    }
}

/// The current task's `struct file *` for `fd`.
#[inline(always)]
pub fn fd_file_ptr(o: &FdFileOffsets, fd: u64) -> Result<*const u8, i32> {
    let fd = fd as i32;
    if o.valid == 0 || fd < 0 {
        return Err(0);
    }
    unsafe {
        let files = read::<*const u8>(current_task(), o.task_files)?;
        let fdt = read::<*const u8>(files, o.files_fdt)?;
        let max = read::<u32>(fdt, o.fdt_max_fds)?;
        if fd as u32 >= max {
            return Err(0);
        }
        let fds = read::<*const u8>(fdt, o.fdt_fd)?;
        read::<*const u8>(fds, fd as u32 * 8)
    }
}

/// Device (kernel dev_t of its superblock) and inode of `file`.
#[inline(always)]
pub unsafe fn file_id(o: &FdFileOffsets, file: *const u8) -> Result<(u32, u64), i32> {
    unsafe {
        let inode = read::<*const u8>(file, o.file_inode)?;
        let ino = read::<u64>(inode, o.inode_ino)?;
        let sb = read::<*const u8>(inode, o.inode_sb)?;
        Ok((read::<u32>(sb, o.sb_dev)?, ino))
    }
}
