//! `faults`: page faults counted per CPU in the kernel, keyed by process,
//! mode, and optionally stacks and page. Best attach first: tp_btf and raw
//! tracepoints skip the perf record a classic tracepoint fills; the software
//! page-fault perf event covers architectures without `exceptions:*`.

use aya_ebpf::{
    bindings::bpf_perf_event_data,
    helpers::bpf_get_current_comm,
    macros::{btf_tracepoint, map, perf_event, raw_tracepoint, tracepoint},
    maps::{Array, PerCpuArray, PerCpuHashMap},
    programs::{
        tracing::StackIdContext, BtfTracePointContext, PerfEventContext, RawTracePointContext,
        TracePointContext,
    },
    EbpfContext, Global,
};
use memtrace_common::{
    faults::{FaultConfig, FaultKey, FaultSlot, FaultVal, FORKED},
    loss, TASK_COMM_LEN,
};

use crate::helpers::{
    bump_by_stack, capture_stacks, capturing, count_gen, count_loss, current_task, current_tgid,
    image_owner, memcg_id, note_member, perf_in_user_mode, tell_member, tp_field, wanted, Stacks,
    FILTER, NO_PREALLOC,
};

#[unsafe(no_mangle)]
static FAULT_CFG: Global<FaultConfig> = Global::new(FaultConfig {
    by_page: 0,
    tp_address: 0,
    tp_error_code: 0,
    slot_mask: 0,
    memcg: 0,
    spill_mask: 0,
});

/// Count-by-process slots (see `FaultSlot`); a colliding process falls back
/// to `FAULTS`. Sized by userspace.
#[map]
static FAULT_SLOTS: PerCpuArray<FaultSlot> = PerCpuArray::with_max_entries(1, 0);

/// Per slot, a process memtrace found gone after reading its final counts:
/// its slot may be taken over. Written only by userspace.
#[map]
static FAULT_SLOT_FREE: Array<u32> = Array::with_max_entries(1, 0);

/// Counts the fault in this CPU's slot for `tgid` when it has one or can
/// take one. The exceptions tracepoints fire with interrupts off, so a slot
/// has one writer at a time and a plain add is exact.
#[inline(always)]
fn count_in_slot(tgid: u32, kernel_mode: u32, mask: u32) -> bool {
    let i = tgid & mask;
    let Some(p) = FAULT_SLOTS.get_ptr_mut(i) else {
        return false;
    };
    let slot = unsafe { &mut *p };
    if slot.tgid == tgid {
        slot.count[(kernel_mode & 1) as usize] += 1;
        return true;
    }
    let free = slot.tgid == 0 || FAULT_SLOT_FREE.get(i).is_some_and(|d| *d == slot.tgid);
    if !free {
        return false;
    }
    slot.tgid = tgid;
    slot.count = [0, 0];
    slot.count[(kernel_mode & 1) as usize] = 1;
    slot.comm = bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]);
    true
}

/// Faults counted, by mode, while the count map was full between two of
/// memtrace's drains (a burst of new processes while memtrace waits for a
/// CPU) and no spill slot could take them: kept without process or stack
/// rather than lost.
#[map]
static FAULT_SPILL: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);

/// Allocated as keys appear: preallocating tens of thousands of per-CPU
/// slots took most of the start-up time.
#[map]
static FAULTS: PerCpuHashMap<FaultKey, FaultVal> =
    PerCpuHashMap::with_max_entries(16384, NO_PREALLOC);

/// The same for the perf-event program: before 6.1 those may only use
/// preallocated maps. Sized only where that path is taken.
#[map]
static FAULTS_PERF: PerCpuHashMap<FaultKey, FaultVal> = PerCpuHashMap::with_max_entries(16384, 0);

/// A fault the full count map could not take: by process in a spill slot
/// where one is free, else in `FAULT_SPILL`. A function of its own: inlined,
/// its stack joined the program's, which with the in-kernel unwinder's
/// went past the 512 bytes a kernel before 6.13 allows.
#[inline(never)]
fn spill(tgid: u32, kernel_mode: u32, mask: u32) {
    count_loss(loss::SPILLED);
    if mask != 0 && tgid != 0 && count_in_slot(tgid, kernel_mode, mask) {
        return;
    }
    if let Some(p) = FAULT_SPILL.get_ptr_mut(kernel_mode & 1) {
        unsafe { *p += 1 };
    }
}

#[inline(always)]
fn count<C: StackIdContext>(
    ctx: &C,
    map: &PerCpuHashMap<FaultKey, FaultVal>,
    addr: u64,
    kernel_mode: u32,
    slots: bool,
) {
    let tgid = current_tgid();
    // Only a stack walk of ours can fault under us: skip the lookup otherwise.
    if !wanted(tgid) || (FILTER.load().stacks != 0 && capturing()) {
        return;
    }
    let cfg = FAULT_CFG.load();
    // tgid 0 marks a free slot; `slots` is false for the perf-event program,
    // which may run with interrupts on.
    if slots && cfg.slot_mask != 0 && tgid != 0 && count_in_slot(tgid, kernel_mode, cfg.slot_mask) {
        return;
    }
    let mut st = capture_stacks(ctx, addr, kernel_mode);
    let owner = image_owner(tgid);
    let mut key = FaultKey {
        tgid: owner,
        kernel_mode: kernel_mode as u8 | if owner != tgid { FORKED } else { 0 },
        gen: count_gen() as u8,
        ustack_check: st.user_check as u16,
        ustack: st.user,
        kstack: st.kern,
        page: if cfg.by_page != 0 { addr & !0xfff } else { 0 },
    };
    let set_user = |k: &mut FaultKey, st: &Stacks| {
        (k.ustack, k.ustack_check) = (st.user, st.user_check as u16)
    };
    let bump = |k: &FaultKey, v: &mut FaultVal| {
        v.count += 1;
        if k.kernel_mode & FORKED != 0 {
            note_member(&mut v.last, tgid, k.tgid, k.ustack, k.kstack);
        }
    };
    if bump_by_stack(map, &mut key, &mut st, set_user, bump) {
        return;
    }
    insert(map, &key, tgid, kernel_mode, slots);
}

/// A new key's first count. A function of its own: the value's bytes stay
/// off the stack of the program, which with the in-kernel unwinder's went
/// past the 512 bytes a kernel before 6.13 allows.
#[inline(never)]
fn insert(
    map: &PerCpuHashMap<FaultKey, FaultVal>,
    key: &FaultKey,
    tgid: u32,
    kernel_mode: u32,
    slots: bool,
) {
    let cfg = FAULT_CFG.load();
    let v = FaultVal {
        count: 1,
        // On the insert path only: once per key and drain, never per fault.
        memcg_id: if cfg.memcg != 0 {
            unsafe { memcg_id(current_task()) }
        } else {
            0
        },
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
        last: tgid,
        _pad: 0,
    };
    if map.insert(key, &v, 0).is_err() {
        spill(
            tgid,
            kernel_mode & 1,
            if slots { cfg.spill_mask } else { 0 },
        );
        return;
    }
    if key.kernel_mode & FORKED != 0 {
        tell_member(tgid, key.tgid, key.ustack, key.kstack);
    }
}

#[btf_tracepoint(function = "page_fault_user")]
pub fn faults_user_btf(ctx: BtfTracePointContext) -> i32 {
    count(&ctx, &FAULTS, ctx.arg::<u64>(0), 0, true);
    0
}

#[btf_tracepoint(function = "page_fault_kernel")]
pub fn faults_kernel_btf(ctx: BtfTracePointContext) -> i32 {
    count(&ctx, &FAULTS, ctx.arg::<u64>(0), 1, true);
    0
}

/// Both tracepoints, one program: loaded and verified once (with the
/// in-kernel unwinder each fault program took about 70 ms to verify). The
/// mode is the error code's user bit (X86_PF_USER), which the CPU sets for
/// a fault taken in user mode: the test that picks the tracepoint.
#[raw_tracepoint(tracepoint = "page_fault_user")]
pub fn faults_raw(ctx: RawTracePointContext) -> i32 {
    let kernel_mode = (ctx.arg::<u64>(2) & 4 == 0) as u32;
    count(&ctx, &FAULTS, ctx.arg::<u64>(0), kernel_mode, true);
    0
}

#[inline(always)]
fn tp_address(ctx: &TracePointContext) -> u64 {
    tp_field(ctx, FAULT_CFG.load().tp_address)
}

#[tracepoint]
pub fn faults_user_tp(ctx: TracePointContext) -> u32 {
    count(&ctx, &FAULTS, tp_address(&ctx), 0, true);
    0
}

#[tracepoint]
pub fn faults_kernel_tp(ctx: TracePointContext) -> u32 {
    count(&ctx, &FAULTS, tp_address(&ctx), 1, true);
    0
}

/// Software page-fault perf event: the sample carries the address and the
/// mode it was taken in.
#[perf_event]
pub fn faults_perf(ctx: PerfEventContext) -> u32 {
    let data = ctx.as_ptr() as *const bpf_perf_event_data;
    let addr = unsafe { (*data).addr };
    let kernel = if perf_in_user_mode(data) { 0 } else { 1 };
    count(&ctx, &FAULTS_PERF, addr, kernel, false);
    0
}
