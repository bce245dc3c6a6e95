//! `mmapsnoop`: one record per mmap, munmap, mremap and brk call. Arguments
//! are kept at sys_enter by thread and sent with the result at sys_exit.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext, Global};
use memtrace_common::{
    kind,
    snoop::{op, FdFileOffsets, MmapSnoopConfig, PendingCall},
};

use crate::helpers::{fd_file, syscall_enter, syscall_exit};

#[unsafe(no_mangle)]
static MMAP_SNOOP: Global<MmapSnoopConfig> = Global::new(MmapSnoopConfig {
    mmap: [0; 6],
    munmap: [0; 2],
    mremap: [0; 5],
    brk: 0,
    mmap_ret: 0,
    munmap_ret: 0,
    mremap_ret: 0,
    brk_ret: 0,
    failed_only: 0,
    self_tgid: 0,
    file: FdFileOffsets {
        task_files: 0,
        files_fdt: 0,
        fdt_max_fds: 0,
        fdt_fd: 0,
        file_inode: 0,
        inode_ino: 0,
        inode_sb: 0,
        sb_dev: 0,
        valid: 0,
    },
});

/// The file behind an mmap call's fd (args[4]), read while the fd is certainly
/// still open; userspace ignores it for anonymous mappings (fd is unused then).
#[inline(always)]
fn mmap_file(c: &MmapSnoopConfig, call: &PendingCall) -> (u32, u64) {
    fd_file(&c.file, call.args[4])
}

#[tracepoint]
pub fn mmap_enter(ctx: TracePointContext) -> u32 {
    let c = MMAP_SNOOP.load();
    syscall_enter(&ctx, op::MMAP, &c.mmap, c.self_tgid);
    0
}

#[tracepoint]
pub fn mmap_exit(ctx: TracePointContext) -> u32 {
    let c = MMAP_SNOOP.load();
    syscall_exit(
        &ctx,
        kind::MMAP_CALL,
        op::MMAP,
        c.mmap_ret,
        c.failed_only,
        |call| mmap_file(&c, call),
    );
    0
}

#[tracepoint]
pub fn munmap_enter(ctx: TracePointContext) -> u32 {
    let c = MMAP_SNOOP.load();
    syscall_enter(&ctx, op::MUNMAP, &c.munmap, c.self_tgid);
    0
}

#[tracepoint]
pub fn munmap_exit(ctx: TracePointContext) -> u32 {
    let c = MMAP_SNOOP.load();
    syscall_exit(
        &ctx,
        kind::MMAP_CALL,
        op::MUNMAP,
        c.munmap_ret,
        c.failed_only,
        |_| (0, 0),
    );
    0
}

#[tracepoint]
pub fn mremap_enter(ctx: TracePointContext) -> u32 {
    let c = MMAP_SNOOP.load();
    syscall_enter(&ctx, op::MREMAP, &c.mremap, c.self_tgid);
    0
}

#[tracepoint]
pub fn mremap_exit(ctx: TracePointContext) -> u32 {
    let c = MMAP_SNOOP.load();
    syscall_exit(
        &ctx,
        kind::MMAP_CALL,
        op::MREMAP,
        c.mremap_ret,
        c.failed_only,
        |_| (0, 0),
    );
    0
}

// Not `brk_enter`: brkstack's programs already have those names.
#[tracepoint]
pub fn snoop_brk_enter(ctx: TracePointContext) -> u32 {
    let c = MMAP_SNOOP.load();
    syscall_enter(&ctx, op::BRK, &[c.brk], c.self_tgid);
    0
}

#[tracepoint]
pub fn snoop_brk_exit(ctx: TracePointContext) -> u32 {
    let c = MMAP_SNOOP.load();
    syscall_exit(
        &ctx,
        kind::MMAP_CALL,
        op::BRK,
        c.brk_ret,
        c.failed_only,
        |_| (0, 0),
    );
    0
}
