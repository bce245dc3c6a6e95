//! Syscall snooping (mmapsnoop, shmsnoop): arguments kept at sys_enter by
//! thread, sent with the result at sys_exit; `snoop_programs!` generates the
//! enter/exit program pair of each call.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::map,
    maps::HashMap,
    programs::TracePointContext,
};
use memtrace_common::{
    loss,
    snoop::{failed, PendingCall, SyscallEvent, MAX_ARGS},
    TASK_COMM_LEN,
};

use super::{
    emit::{count_loss, emit_streamed},
    filter::{current_tgid, wanted},
    stacks::stack_ids,
};

/// The sys_enter and sys_exit programs of snooped calls, two per call. Each
/// program loads the tool's config global as `$c`, which the argument
/// offsets (`args`), the result offset (`ret`) and the optional file lookup
/// (`file |call| ...`, from the pending call to a device and inode) read:
///
/// ```ignore
/// snoop_programs!(SHM_SNOOP as c, kind::SHM_CALL, {
///     shmget_enter, shmget_exit: op::SHMGET, args c.shmget, ret c.shmget_ret;
/// });
/// ```
macro_rules! snoop_programs {
    ($cfg:ident as $c:ident, $kind:expr, {
        $($enter:ident, $exit:ident: $op:expr, args $args:expr, ret $ret:expr
            $(, file |$call:ident| $file:expr)?;)*
    }) => {$(
        #[aya_ebpf::macros::tracepoint]
        pub fn $enter(ctx: aya_ebpf::programs::TracePointContext) -> u32 {
            let $c = $cfg.load();
            $crate::helpers::syscall_enter(&ctx, $op, &$args, $c.self_tgid);
            0
        }

        #[aya_ebpf::macros::tracepoint]
        pub fn $exit(ctx: aya_ebpf::programs::TracePointContext) -> u32 {
            let $c = $cfg.load();
            $crate::helpers::syscall_exit(
                &ctx,
                $kind,
                $op,
                $ret,
                $c.failed_only,
                snoop_programs!(@file $($call => $file)?),
            );
            0
        }
    )*};
    (@file $call:ident => $file:expr) => {
        |$call: &memtrace_common::snoop::PendingCall| $file
    };
    (@file) => {
        |_: &memtrace_common::snoop::PendingCall| (0, 0)
    };
}

/// Calls between sys_enter and sys_exit, by thread id (mmapsnoop, shmsnoop):
/// the arguments are only in the enter tracepoint, the result only in the exit one.
#[map]
pub static SNOOP_PENDING: HashMap<u32, PendingCall> = HashMap::with_max_entries(4096, 0);

/// sys_enter of a snooped call: keeps its arguments, read at the offsets the
/// format file gave, until its sys_exit.
#[inline(always)]
pub fn syscall_enter(ctx: &TracePointContext, op: u32, offsets: &[u32], self_tgid: u32) {
    let tgid = current_tgid();
    if tgid == self_tgid || !wanted(tgid) {
        return;
    }
    let mut call = PendingCall {
        op,
        _pad: 0,
        args: [0; MAX_ARGS],
    };
    // zip, not indexing: no bounds check for the verifier to see.
    // The arguments are 8-byte fields in the record's first 64 bytes: one
    // read for all (each helper call costs tens of ns on a mitigated kernel).
    let Ok(words) = (unsafe { ctx.read_at::<[u64; 8]>(0) }) else {
        count_loss(loss::READ);
        return;
    };
    for (arg, off) in call.args.iter_mut().zip(offsets) {
        *arg = words[(*off as usize / 8) & 7];
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    if SNOOP_PENDING.insert(tid, call, 0).is_err() {
        count_loss(loss::MAP_FULL);
    }
}

/// sys_exit of a snooped call: one record with the arguments and the result.
/// Only threads whose entry was kept have an entry, so this filters by pid too.
#[inline(always)]
pub fn syscall_exit(
    ctx: &TracePointContext,
    kind: u32,
    op: u32,
    ret_off: u32,
    failed_only: u32,
    file_of: impl Fn(&PendingCall) -> (u32, u64),
) {
    let id = bpf_get_current_pid_tgid();
    let tid = id as u32;
    let call = match SNOOP_PENDING.get_ptr(tid) {
        Some(p) => unsafe { *p },
        None => return,
    };
    let _ = SNOOP_PENDING.remove(tid);
    // A different op: the entry of this call was missed (attached mid-call).
    if call.op != op {
        return;
    }
    let ret = match unsafe { ctx.read_at::<i64>(ret_off as usize) } {
        Ok(r) => r,
        Err(_) => {
            count_loss(loss::READ);
            return;
        }
    };
    if failed_only != 0 && !failed(op, call.args[0], ret) {
        return;
    }
    let (ustack, kstack) = stack_ids(ctx, 0, 0);
    let (file_dev, file_ino) = file_of(&call);
    let ev = SyscallEvent {
        kind,
        op,
        pid: (id >> 32) as u32,
        tid,
        ret,
        args: call.args,
        ustack,
        kstack,
        file_dev,
        _pad: 0,
        file_ino,
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
    };
    emit_streamed(&ev);
}
