//! `shmsnoop`: one record per SysV shm call (shmget, shmat, shmdt, shmctl),
//! from the syscall tracepoints (BCC's shmsnoop needs kprobes).

use aya_ebpf::{macros::tracepoint, programs::TracePointContext, Global};
use memtrace_common::{
    kind,
    snoop::{op, ShmSnoopConfig},
};

use crate::helpers::{syscall_enter, syscall_exit};

#[unsafe(no_mangle)]
static SHM_SNOOP: Global<ShmSnoopConfig> = Global::new(ShmSnoopConfig {
    shmget: [0; 3],
    shmat: [0; 3],
    shmdt: 0,
    shmctl: [0; 3],
    shmget_ret: 0,
    shmat_ret: 0,
    shmdt_ret: 0,
    shmctl_ret: 0,
    failed_only: 0,
    self_tgid: 0,
});

#[tracepoint]
pub fn shmget_enter(ctx: TracePointContext) -> u32 {
    let c = SHM_SNOOP.load();
    syscall_enter(&ctx, op::SHMGET, &c.shmget, c.self_tgid);
    0
}

#[tracepoint]
pub fn shmget_exit(ctx: TracePointContext) -> u32 {
    let c = SHM_SNOOP.load();
    syscall_exit(
        &ctx,
        kind::SHM_CALL,
        op::SHMGET,
        c.shmget_ret,
        c.failed_only,
        |_| (0, 0),
    );
    0
}

#[tracepoint]
pub fn shmat_enter(ctx: TracePointContext) -> u32 {
    let c = SHM_SNOOP.load();
    syscall_enter(&ctx, op::SHMAT, &c.shmat, c.self_tgid);
    0
}

#[tracepoint]
pub fn shmat_exit(ctx: TracePointContext) -> u32 {
    let c = SHM_SNOOP.load();
    syscall_exit(
        &ctx,
        kind::SHM_CALL,
        op::SHMAT,
        c.shmat_ret,
        c.failed_only,
        |_| (0, 0),
    );
    0
}

#[tracepoint]
pub fn shmdt_enter(ctx: TracePointContext) -> u32 {
    let c = SHM_SNOOP.load();
    syscall_enter(&ctx, op::SHMDT, &[c.shmdt], c.self_tgid);
    0
}

#[tracepoint]
pub fn shmdt_exit(ctx: TracePointContext) -> u32 {
    let c = SHM_SNOOP.load();
    syscall_exit(
        &ctx,
        kind::SHM_CALL,
        op::SHMDT,
        c.shmdt_ret,
        c.failed_only,
        |_| (0, 0),
    );
    0
}

#[tracepoint]
pub fn shmctl_enter(ctx: TracePointContext) -> u32 {
    let c = SHM_SNOOP.load();
    syscall_enter(&ctx, op::SHMCTL, &c.shmctl, c.self_tgid);
    0
}

#[tracepoint]
pub fn shmctl_exit(ctx: TracePointContext) -> u32 {
    let c = SHM_SNOOP.load();
    syscall_exit(
        &ctx,
        kind::SHM_CALL,
        op::SHMCTL,
        c.shmctl_ret,
        c.failed_only,
        |_| (0, 0),
    );
    0
}
