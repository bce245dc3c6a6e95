//! `oomkill`: one record per OOM kill. Four ways in, best first: kprobe and
//! fentry on `oom_kill_process` see `oom_control` (totalpages, the OOM's memcg);
//! tp_btf and the classic tracepoint on `mark_victim` see only the victim.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel_str_bytes},
    macros::{btf_tracepoint, fentry, kprobe, map, raw_tracepoint, tracepoint},
    maps::PerCpuArray,
    programs::{
        BtfTracePointContext, FEntryContext, ProbeContext, RawTracePointContext, TracePointContext,
    },
    EbpfContext, Global,
};
use memtrace_common::{
    kind, loss, method,
    oom::{OomEvent, OomKprobeOffsets, OomTpOffsets},
    TASK_COMM_LEN,
};

use crate::helpers::{
    count_loss, css_cgroup_id, current_task, emit, memcg_id, read0, stack_ids, tp_field, TASK,
};

#[unsafe(no_mangle)]
static OOM_TP: Global<OomTpOffsets> = Global::new(OomTpOffsets {
    pid: 0,
    comm: 0,
    total_vm: 0,
    anon_rss: 0,
    file_rss: 0,
    shmem_rss: 0,
    uid: 0,
    oom_score_adj: 0,
    has_rss: 0,
});

/// 1: the trigger's stacks are taken (`oomkill --stack`). Tools that watch
/// kills without them (memcg, top, serve) leave it 0, and, a constant to
/// the verifier, the stack code is then never checked: with their
/// allocation probes' in-kernel unwinder in it, 6.12 refused these programs
/// ("combined stack size ... too large") and memcg fell back to frame
/// pointers everywhere.
#[unsafe(no_mangle)]
static OOM_STACKS: Global<u32> = Global::new(0);

#[unsafe(no_mangle)]
static OOM_CONTROL: Global<OomKprobeOffsets> = Global::new(OomKprobeOffsets {
    totalpages: 0,
    chosen: 0,
    memcg: 0,
    memcg_css: 0,
});

// mm_struct rss_stat indexes (enum in include/linux/mm_types_task.h; stable since 2.6).
const MM_FILEPAGES: u32 = 0;
const MM_ANONPAGES: u32 = 1;
const MM_SHMEMPAGES: u32 = 3;

/// The event being put together: in a per-CPU slot, not on the stack, so
/// that the programs' own frame leaves the in-kernel unwinder room. 6.1
/// counts the unwinder against the 512-byte combined stack even where
/// `OOM_STACKS` keeps it from being called, and refused these programs
/// with the event on the stack.
#[map]
static OOM_SCRATCH: PerCpuArray<OomEvent> = PerCpuArray::with_max_entries(1, 0);

/// A new event in the scratch slot, its trigger filled in; None (counted)
/// if the slot cannot be had.
#[inline(always)]
fn new_event<C: aya_ebpf::programs::tracing::StackIdContext>(
    ctx: &C,
    how: u32,
) -> Option<&'static mut OomEvent> {
    let Some(ev) = OOM_SCRATCH.get_ptr_mut(0) else {
        count_loss(loss::READ);
        return None;
    };
    // SAFETY: this CPU's slot; the program runs to its end on this CPU.
    let ev = unsafe { &mut *ev };
    let id = bpf_get_current_pid_tgid();
    let (ustack, kstack) = match OOM_STACKS.load() {
        0 => (-1, -1),
        _ => stack_ids(ctx, 0, 0),
    };
    // Field by field: a struct literal may be built on the stack first.
    ev.kind = kind::OOM;
    ev.method = how;
    ev.trigger_pid = (id >> 32) as u32;
    ev.trigger_tid = id as u32;
    ev.victim_pid = 0;
    ev.victim_tid = 0;
    ev.uid = 0;
    ev.oom_score_adj = 0;
    ev.total_vm_kb = 0;
    ev.anon_rss_kb = 0;
    ev.file_rss_kb = 0;
    ev.shmem_rss_kb = 0;
    ev.totalpages = 0;
    ev.memcg_id = 0;
    ev.memcg_source = 0;
    ev.ustack = ustack;
    ev.kstack = kstack;
    ev._pad = 0;
    ev.trigger_comm = bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]);
    ev.victim_comm = [0; TASK_COMM_LEN];
    Some(ev)
}

/// Fills the victim's identity and memory from its `task_struct`.
#[inline(always)]
unsafe fn fill_victim(ev: &mut OomEvent, task: *const u8) {
    let t = TASK.load();
    if t.valid == 0 || task.is_null() {
        return;
    }
    unsafe {
        ev.victim_tid = read0::<i32>(task, t.pid) as u32;
        ev.victim_pid = read0::<i32>(task, t.tgid) as u32;
        ev.victim_comm = read0::<[u8; TASK_COMM_LEN]>(task, t.comm);
        ev.uid = read0::<u32>(read0::<*const u8>(task, t.task_cred), t.cred_uid);
        let sig = read0::<*const u8>(task, t.task_signal);
        ev.oom_score_adj = read0::<i16>(sig, t.signal_oom_score_adj) as i32;
        // A task without mm (or a failed read) reads as all zero.
        let mm = read0::<*const u8>(task, t.mm);
        let counter = |i: u32| -> u64 {
            let off = t.mm_rss_stat + i * t.rss_stride + t.rss_count;
            // The kernel reports the shared counter, clamped at 0, like get_mm_counter().
            read0::<i64>(mm, off).max(0) as u64 * t.page_kb as u64
        };
        ev.file_rss_kb = counter(MM_FILEPAGES);
        ev.anon_rss_kb = counter(MM_ANONPAGES);
        ev.shmem_rss_kb = counter(MM_SHMEMPAGES);
        ev.total_vm_kb = read0::<u64>(mm, t.mm_total_vm) * t.page_kb as u64;
        if ev.memcg_id == 0 {
            ev.memcg_id = memcg_id(task);
            ev.memcg_source = 2;
        }
    }
}

/// kprobe/fentry: `oom_kill_process(struct oom_control *oc, const char *message)`.
#[inline(always)]
unsafe fn on_oom_control<C: aya_ebpf::programs::tracing::StackIdContext>(
    ctx: &C,
    oc: *const u8,
    how: u32,
) {
    let o = OOM_CONTROL.load();
    let Some(ev) = new_event(ctx, how) else {
        return;
    };
    unsafe {
        ev.totalpages = read0::<u64>(oc, o.totalpages);
        let memcg = read0::<*const u8>(oc, o.memcg);
        if !memcg.is_null() {
            ev.memcg_id = css_cgroup_id(memcg.add(o.memcg_css as usize));
            ev.memcg_source = 1;
        }
        let chosen = read0::<*const u8>(oc, o.chosen);
        fill_victim(ev, chosen);
    }
    emit(ev);
}

#[kprobe]
pub fn oom_kprobe(ctx: ProbeContext) -> u32 {
    if let Some(oc) = ctx.arg::<*const u8>(0) {
        unsafe { on_oom_control(&ctx, oc, method::KPROBE) };
    }
    0
}

#[fentry(function = "oom_kill_process")]
pub fn oom_fentry(ctx: FEntryContext) -> i32 {
    let oc: *const u8 = ctx.arg(0);
    unsafe { on_oom_control(&ctx, oc, method::FENTRY) };
    0
}

/// `mark_victim(struct task_struct *task, uid_t uid)` as a raw tracepoint:
/// the same argument as tp_btf, without needing kernel BTF to attach.
#[raw_tracepoint(tracepoint = "mark_victim")]
pub fn oom_raw_tp(ctx: RawTracePointContext) -> i32 {
    let task = ctx.arg::<u64>(0) as *const u8;
    let Some(ev) = new_event(&ctx, method::RAW_TP) else {
        return 0;
    };
    unsafe { fill_victim(ev, task) };
    emit(ev);
    0
}

/// `mark_victim(struct task_struct *task, uid_t uid)`.
#[btf_tracepoint(function = "mark_victim")]
pub fn oom_tp_btf(ctx: BtfTracePointContext) -> i32 {
    let task: *const u8 = ctx.arg(0);
    let Some(ev) = new_event(&ctx, method::TP_BTF) else {
        return 0;
    };
    unsafe { fill_victim(ev, task) };
    emit(ev);
    0
}

/// `oom:mark_victim`, with field offsets from its format file. The record has
/// no task pointer: the memcg is the triggering task's.
#[tracepoint]
pub fn oom_tracepoint(ctx: TracePointContext) -> u32 {
    let o = OOM_TP.load();
    let Some(ev) = new_event(&ctx, method::TRACEPOINT) else {
        return 0;
    };
    let pid = tp_field::<i32>(&ctx, o.pid) as u32;
    ev.victim_tid = pid;
    ev.victim_pid = pid;
    // `__data_loc`: the string's offset in the record in the low 16 bits
    // (0 only when that read failed, counted already).
    let loc: u32 = tp_field(&ctx, o.comm);
    let src = unsafe { (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize) };
    if loc != 0 && unsafe { bpf_probe_read_kernel_str_bytes(src, &mut ev.victim_comm) }.is_err() {
        count_loss(loss::READ);
    }
    ev.uid = tp_field(&ctx, o.uid);
    if o.has_rss != 0 {
        ev.total_vm_kb = tp_field(&ctx, o.total_vm);
        ev.anon_rss_kb = tp_field(&ctx, o.anon_rss);
        ev.file_rss_kb = tp_field(&ctx, o.file_rss);
        ev.shmem_rss_kb = tp_field(&ctx, o.shmem_rss);
        ev.oom_score_adj = tp_field::<i16>(&ctx, o.oom_score_adj) as i32;
    }
    ev.memcg_id = unsafe { memcg_id(current_task()) };
    ev.memcg_source = 3;
    emit(ev);
    0
}
