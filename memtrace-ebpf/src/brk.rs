//! `brkstack`: brk calls counted by (process, user stack) in the kernel, with
//! the bytes the heap grew by: the requested break against the break before
//! the call (`mm->brk`). One tracepoint per call, no enter/exit pairing: the
//! cost per call stays close to a plain count.

use aya_ebpf::{
    helpers::bpf_get_current_comm,
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
    Global,
};
use memtrace_common::{
    brk::BrkConfig,
    stacks::{StackKey, StackVal},
    TASK_COMM_LEN,
};

use crate::helpers::{
    atomic_add, bump_by_stack, capture_stacks, count_gen, count_refused, current_mm_u64,
    current_tgid, image_owner, note_member, tell_member, tp_field, wanted, Stacks, NO_PREALLOC,
    TASK,
};

#[unsafe(no_mangle)]
static BRK_CFG: Global<BrkConfig> = Global::new(BrkConfig { tp_brk: 0, _pad: 0 });

/// One value per key that every CPU adds to atomically, as memleak's
/// totals: a per-CPU value comes from per-CPU memory where the call is
/// made, which a burst of new stacks on a loaded host finds empty.
#[map]
static BRK_STACKS: HashMap<StackKey, StackVal> = HashMap::with_max_entries(8192, NO_PREALLOC);

#[tracepoint]
pub fn brk_enter(ctx: TracePointContext) -> u32 {
    let tgid = current_tgid();
    if !wanted(tgid) {
        return 0;
    }
    let t = TASK.load();
    let requested: u64 = tp_field(&ctx, BRK_CFG.load().tp_brk);
    let current = current_mm_u64(t.mm_brk);
    // brk(0) and shrinking calls grow nothing.
    let grew = if current != 0 && requested > current {
        requested - current
    } else {
        0
    };
    let mut st = capture_stacks(&ctx, grew, 0);
    let owner = image_owner(tgid);
    let mut key = StackKey {
        tgid: owner,
        forked: (owner != tgid) as u32,
        ustack: st.user,
        kstack: st.kern,
        ustack_check: st.user_check,
        gen: count_gen(),
    };
    let set_user =
        |k: &mut StackKey, st: &Stacks| (k.ustack, k.ustack_check) = (st.user, st.user_check);
    let bump = |k: &StackKey, v: &mut StackVal| {
        atomic_add(&mut v.count, 1);
        atomic_add(&mut v.bytes, grew);
        if k.forked != 0 {
            note_member(&mut v.last, tgid, k.tgid, k.ustack, k.kstack);
        }
    };
    if bump_by_stack(&BRK_STACKS, &mut key, &mut st, set_user, bump) {
        return 0;
    }
    let v = StackVal {
        count: 1,
        bytes: grew,
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
        last: tgid,
        _pad: 0,
    };
    if let Err(e) = BRK_STACKS.insert(&key, &v, 0) {
        count_refused(e);
        return 0;
    }
    if key.forked != 0 {
        tell_member(tgid, key.tgid, key.ustack, key.kstack);
    }
    0
}
