//! `brkstack`: brk calls counted by (process, user stack) in the kernel, with
//! the bytes the heap grew by: the break before the call (`mm->brk`, read at
//! sys_enter) against the one the call returned.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{map, tracepoint},
    maps::{HashMap, PerCpuHashMap},
    programs::TracePointContext,
    Global,
};
use memtrace_common::{
    loss,
    stacks::{BrkConfig, StackKey, StackVal},
    TASK_COMM_LEN,
};

use crate::helpers::{count_loss, current_task, current_tgid, read, stack_ids, wanted, TASK};

#[unsafe(no_mangle)]
static BRK_CFG: Global<BrkConfig> = Global::new(BrkConfig { tp_ret: 0, _pad: 0 });

/// Break at sys_enter, by thread.
#[map]
static BRK_PENDING: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

#[map]
static BRK_STACKS: PerCpuHashMap<StackKey, StackVal> = PerCpuHashMap::with_max_entries(8192, 0);

#[tracepoint]
pub fn brk_enter(_ctx: TracePointContext) -> u32 {
    if !wanted(current_tgid()) {
        return 0;
    }
    let t = TASK.load();
    let old =
        unsafe { read::<*const u8>(current_task(), t.mm).and_then(|mm| read::<u64>(mm, t.mm_brk)) };
    let tid = bpf_get_current_pid_tgid() as u32;
    match old {
        Ok(old) => {
            if BRK_PENDING.insert(tid, old, 0).is_err() {
                count_loss(loss::MAP_FULL);
            }
        }
        Err(_) => count_loss(loss::READ),
    }
    0
}

#[tracepoint]
pub fn brk_exit(ctx: TracePointContext) -> u32 {
    let tgid = current_tgid();
    if !wanted(tgid) {
        return 0;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    // 0 when the entry was missed; written so that both paths define `old`
    // (an Option here let LLVM read an uninitialized register).
    let old = BRK_PENDING.get_ptr(tid).map(|p| unsafe { *p }).unwrap_or(0);
    let _ = BRK_PENDING.remove(tid);
    let ret = unsafe { ctx.read_at::<u64>(BRK_CFG.load().tp_ret as usize) }.unwrap_or(0);
    let grew = if old != 0 && ret > old { ret - old } else { 0 };
    let (ustack, kstack) = stack_ids(&ctx);
    let key = StackKey {
        tgid,
        ustack,
        kstack,
        _pad: 0,
    };
    if let Some(v) = BRK_STACKS.get_ptr_mut(&key) {
        unsafe {
            (*v).count += 1;
            (*v).bytes += grew;
        }
        return 0;
    }
    let v = StackVal {
        count: 1,
        bytes: grew,
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
    };
    if BRK_STACKS.insert(&key, &v, 0).is_err() {
        count_loss(loss::MAP_FULL);
    }
    0
}
