//! `shmsnoop`: one record per SysV shm call (shmget, shmat, shmdt, shmctl),
//! from the syscall tracepoints (BCC's shmsnoop needs kprobes).

use aya_ebpf::Global;
use memtrace_common::{
    kind,
    snoop::{op, ShmSnoopConfig},
};

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

snoop_programs!(SHM_SNOOP as c, kind::SHM_CALL, {
    shmget_enter, shmget_exit: op::SHMGET, args c.shmget, ret c.shmget_ret;
    shmat_enter, shmat_exit: op::SHMAT, args c.shmat, ret c.shmat_ret;
    shmdt_enter, shmdt_exit: op::SHMDT, args [c.shmdt], ret c.shmdt_ret;
    shmctl_enter, shmctl_exit: op::SHMCTL, args c.shmctl, ret c.shmctl_ret;
});
