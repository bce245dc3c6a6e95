//! Programs that follow the process tree: forks of traced processes (for
//! `--children`) and the names they take at exec.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{map, tracepoint},
    maps::LruHashMap,
    programs::TracePointContext,
};
use memtrace_common::{kind, loss, stack_mode, ExecName, ProcEvent};

use super::{
    emit::{count_loss, emit},
    filter::{current_tgid, wanted, FILTER, FOLLOWED},
    kunwind::{drop_table, inherit_table},
    reads::{current_task, memcg_id},
};

/// `sched:sched_process_fork`: follow the children of traced processes.
#[tracepoint]
pub fn follow_fork(ctx: TracePointContext) -> u32 {
    let f = FILTER.load();
    let parent = current_tgid();
    if f.tgid == 0 {
        // System-wide, only unwinding in the kernel attaches this: every
        // child starts with its parent's table.
        if f.stacks & stack_mode::KUNWIND != 0 {
            if let Ok(child) = unsafe { ctx.read_at::<u32>(f.fork_child_pid as usize) } {
                inherit_table(parent, child);
            }
        }
        return 0;
    }
    if !(parent == f.tgid || unsafe { FOLLOWED.get(parent) }.is_some()) {
        // Every new process passes here: one whose pid a followed process
        // that exited had is no descendant (pids are reused), unfollow it.
        if let Ok(child) = unsafe { ctx.read_at::<u32>(f.fork_child_pid as usize) } {
            if unsafe { FOLLOWED.get(child) }.is_some() {
                let _ = FOLLOWED.remove(child);
            }
        }
        return 0;
    }
    match unsafe { ctx.read_at::<u32>(f.fork_child_pid as usize) } {
        Ok(child) => {
            if FOLLOWED.insert(child, 1u8, 0).is_err() {
                count_loss(loss::MAP_FULL);
            }
            if f.stacks & stack_mode::KUNWIND != 0 {
                inherit_table(parent, child);
            }
            // Userspace keeps the parent's maps for the child (rare event).
            emit(&ProcEvent {
                kind: kind::PROC_FORK,
                pid: child,
                parent,
                _pad: 0,
            });
        }
        // A child not followed: its events go missing, so say so.
        Err(_) => count_loss(loss::READ),
    }
    0
}

/// The name each traced process took at its last exec. Counting tools keep
/// the name seen at a key's first event, and a forked child's first faults
/// come before its exec, under its parent's name. Sized by the tools that
/// use it; LRU: a name pushed out leaves the first-seen one.
#[map]
pub static EXEC_NAMES: LruHashMap<u32, ExecName> = LruHashMap::with_max_entries(1, 0);

/// `sched:sched_process_exec` (rare): remember the new name, and let go of
/// the old image's unwind table.
#[tracepoint]
pub fn name_exec(_ctx: TracePointContext) -> u32 {
    let tgid = current_tgid();
    if wanted(tgid) {
        if FILTER.load().stacks & stack_mode::KUNWIND != 0 {
            drop_table(tgid);
        }
        if let Ok(comm) = bpf_get_current_comm() {
            // Its group too: a process is moved into its group before it
            // execs (a container's init, `cgexec`), after its first events.
            let memcg_id = unsafe { memcg_id(current_task()) };
            let _ = EXEC_NAMES.insert(&tgid, &ExecName { comm, memcg_id }, 0);
        }
        // A followed process's new image: userspace reads its maps.
        if FILTER.load().children != 0 {
            emit(&ProcEvent {
                kind: kind::PROC_EXEC,
                pid: tgid,
                parent: 0,
                _pad: 0,
            });
        }
    }
    0
}

/// `sched:sched_process_exit`, with unwinding in the kernel: the exiting
/// thread's table goes (the process's when it is the group leader; a
/// thread's own when a fork gave it one). The table map stays as small as
/// the live processes, however many come and go.
#[tracepoint]
pub fn unwind_exit(_ctx: TracePointContext) -> u32 {
    if FILTER.load().stacks & stack_mode::KUNWIND != 0 {
        drop_table(bpf_get_current_pid_tgid() as u32);
    }
    0
}
