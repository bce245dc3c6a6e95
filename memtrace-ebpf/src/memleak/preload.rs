//! User mode through memleak's preloaded shim (memtrace/preload/): one
//! probe site per reported call, at a nop the kernel emulates. The shim has already sampled, so an allocation
//! reported here is recorded at the weight it gives without drawing again.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::{map, tracepoint},
    maps::{HashMap, PerCpuArray},
    programs::TracePointContext,
};
use aya_ebpf::{macros::uprobe, programs::ProbeContext};
use memtrace_common::{
    loss,
    memleak::{counter, origin, BATCH_ENTRIES_AT, FREE_BATCH},
    shim::{BatchEntry, KIND_SHIFT},
};

#[cfg(not(feature = "compat"))]
use super::batched::{batched, batched_free};
#[cfg(feature = "compat")]
use super::release_before;
use super::user::traced;
use super::{add, bump, memo, record_stacks, release, weigh, USER};
use crate::helpers::{capture_stacks, count_loss, current_tgid, Stacks, NO_PREALLOC};
#[cfg(not(feature = "compat"))]
use memtrace_common::shim::ALLOCATED;

/// Each thread's batch of frees in the shim, by thread id.
#[map]
static ML_BATCHES: HashMap<u32, u64> = HashMap::with_max_entries(65536, NO_PREALLOC);

/// `memtrace_alloc_site(p, size, old, skipped, origin, weight)`: a new block
/// (or none: p is 0 when only the old one is reported), the block it
/// replaces (realloc), and its weight (2^-16 allocations: 1/(1 - e^(-size/N))
/// under sampling). The allocations passed over come with frees. The
/// origin's high bits name the shim's function that called (`shim`'s
/// kinds): an exact allocation's unwind is published for it (`memo`).
#[uprobe]
pub fn ml_preload_alloc(ctx: ProbeContext) -> u32 {
    let tgid = current_tgid();
    if !traced(tgid) {
        return 0;
    }
    let (p, size) = (
        ctx.arg::<u64>(0).unwrap_or(0),
        ctx.arg::<u64>(1).unwrap_or(0),
    );
    // The stacks first, before any other branch: with the in-kernel
    // unwinder, each path into it is one more walk of it for the verifier.
    let st = if p != 0 {
        capture_stacks(&ctx, size, 0)
    } else {
        Stacks::NONE
    };
    keep_alloc(&ctx, tgid, &st)
}

/// The rest of `ml_preload_alloc`, in a frame of its own: its locals are
/// not on the stack while the unwinder's frames are (the verifier bounds
/// the frames of a call chain together).
#[inline(never)]
fn keep_alloc(ctx: &ProbeContext, tgid: u32, st: &Stacks) -> u32 {
    let st = *st;
    let arg = |i| ctx.arg::<u64>(i).unwrap_or(0);
    let (p, size, old, from, w) = (arg(0), arg(1), arg(2), arg(4), arg(5));
    let (from, kind) = (from & 0xff, from >> KIND_SHIFT);
    if old != 0 {
        release(USER, tgid, old, origin::USER);
    }
    if p == 0 {
        return 0;
    }
    // Anonymous mmaps come unsampled: drawn here, as without the shim.
    let mmap = from == origin::MMAP as u64;
    let w = if mmap {
        super::admit(size)
    } else {
        weigh(size, w)
    };
    let from = if mmap { origin::MMAP } else { origin::USER };
    let Some(w) = w else {
        return 0;
    };
    let kept = record_stacks(USER, tgid, p, size, from, w, st);
    #[cfg(not(feature = "compat"))]
    if let Some((id, check)) = kept {
        let c = super::MEMLEAK_CFG.load();
        let exact = w.0 == 1 && w.1 == size && c.min_size == 0 && c.max_size == 0;
        if c.shim_memo != 0 && kind != 0 && exact && st.kern < 0 && id >= 0 {
            let tid = aya_ebpf::helpers::bpf_get_current_pid_tgid() as u32;
            let stack = ((id as u32 as u64) << 32) | check as u64;
            memo::publish(tid, tgid, stack, kind, &ML_BATCHES);
        }
    }
    #[cfg(feature = "compat")]
    let _ = (kept, kind);
    0
}

/// `memtrace_free_site(p, origin, skipped)`: a block about to go back (free,
/// munmap), and the allocations the thread's sampling passed over since its
/// last report. Under sampling only sampled blocks are reported.
#[uprobe]
pub fn ml_preload_free(ctx: ProbeContext) -> u32 {
    let tgid = current_tgid();
    if !traced(tgid) {
        return 0;
    }
    let p = ctx.arg::<u64>(0).unwrap_or(0);
    // The allocations the thread's sampling passed over come with its frees
    // (kept out of the allocation program, which the unwinder fills).
    add(counter::UNSAMPLED, ctx.arg::<u64>(2).unwrap_or(0));
    if ctx.arg::<u64>(1).unwrap_or(0) == origin::MMAP as u64 {
        release(USER, tgid, p, origin::MMAP);
    } else {
        super::user::free_user(tgid, p);
    }
    0
}

/// `memtrace_frees_site(entries, n)`: a thread's batch of frees (every call
/// followed), each an address and the time of its free.
#[uprobe]
pub fn ml_preload_frees(ctx: ProbeContext) -> u32 {
    let tgid = current_tgid();
    if traced(tgid) {
        apply_batch(
            tgid,
            ctx.arg::<u64>(0).unwrap_or(0),
            ctx.arg::<u64>(1).unwrap_or(0),
        );
    }
    0
}

/// `memtrace_batch_site(batch, tid)`: thread `tid`'s batch (0: none any
/// more), kept by thread so that its exit reports what it still holds (a
/// process that ends without its destructors: _exit, a signal, a crash).
#[uprobe]
pub fn ml_preload_batch(ctx: ProbeContext) -> u32 {
    if !traced(current_tgid()) {
        return 0;
    }
    let tid = ctx.arg::<u64>(1).unwrap_or(0) as u32;
    match ctx.arg::<u64>(0).unwrap_or(0) {
        0 => {
            let _ = ML_BATCHES.remove(&tid);
            memo::forget(tid);
        }
        at => {
            let _ = ML_BATCHES.insert(&tid, &at, 0);
        }
    }
    0
}

/// An exec: the thread's batch was in the image it left (what it held
/// went with it), and its slots of the memo with it.
#[inline(always)]
pub(super) fn left_image(tid: u32) {
    if ML_BATCHES.remove(&tid).is_ok() {
        memo::forget(tid);
    }
}

/// A thread's exit, before its memory goes: the frees left in its batch.
#[tracepoint]
pub fn ml_batch_exit(_ctx: TracePointContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let Some(&at) = (unsafe { ML_BATCHES.get(&(id as u32)) }) else {
        return 0;
    };
    // A thread number taken again by a stranger: not its batch.
    if !traced((id >> 32) as u32) {
        let _ = ML_BATCHES.remove(&(id as u32));
        return 0;
    }
    let _ = ML_BATCHES.remove(&(id as u32));
    memo::forget(id as u32);
    match unsafe { bpf_probe_read_user(at as *const u32) } {
        Ok(n) => apply_batch((id >> 32) as u32, at + BATCH_ENTRIES_AT, n as u64),
        Err(_) => count_loss(loss::READ),
    }
    0
}

/// A batch read in one go, per CPU: one read where there was one per free
/// (each read's fixed cost was most of a batched free's).
#[map]
static ML_BATCH_READ: PerCpuArray<[BatchEntry; FREE_BATCH as usize]> =
    PerCpuArray::with_max_entries(1, 0);

/// Applies the `n` entries of a batch at `at`, in order: frees, and
/// allocations whose stack the shim took from the memo.
#[inline(always)]
fn apply_batch(tgid: u32, at: u64, n: u64) {
    let Some(buf) = ML_BATCH_READ.get_ptr_mut(0) else {
        return;
    };
    let n = n.min(FREE_BATCH as u64);
    let size = core::mem::size_of::<BatchEntry>() as u32;
    // Bounded for the verifier: at most the buffer.
    let len = core::hint::black_box(n as u32 * size) & (2 * FREE_BATCH * size - 1);
    if len == 0 || len as usize > core::mem::size_of::<[BatchEntry; FREE_BATCH as usize]>() {
        return;
    }
    let r = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            buf as *mut core::ffi::c_void,
            len,
            at as *const core::ffi::c_void,
        )
    };
    if r != 0 {
        count_loss(loss::READ);
        return;
    }
    let entries = unsafe { &*buf };
    // With the in-kernel unwinder (and so the memo), entries may be
    // allocations: one entry a step of a `bpf_loop`, which the verifier
    // checks once (the whole loop unrolled was past its limit).
    #[cfg(not(feature = "compat"))]
    {
        let mut b = Batch { tgid, entries };
        unsafe {
            aya_ebpf::helpers::generated::bpf_loop(
                n as u32,
                apply_entry as *mut core::ffi::c_void,
                &mut b as *mut Batch as *mut core::ffi::c_void,
                0,
            )
        };
    }
    #[cfg(feature = "compat")]
    for (i, e) in entries.iter().enumerate() {
        if i as u64 >= n {
            break;
        }
        release_before(USER, tgid, e.addr, e.ts_ns);
    }
}

/// A batch being applied (`bpf_loop`'s context).
#[cfg(not(feature = "compat"))]
struct Batch {
    tgid: u32,
    entries: &'static [BatchEntry; FREE_BATCH as usize],
}

/// `bpf_loop` step `i`: entry `i`.
#[cfg(not(feature = "compat"))]
#[inline(never)]
extern "C" fn apply_entry(i: u32, ctx: *mut core::ffi::c_void) -> i64 {
    let b = unsafe { &*(ctx as *const Batch) };
    let e = &b.entries[i as usize & (FREE_BATCH as usize - 1)];
    if e.stack & ALLOCATED == 0 {
        batched_free(b.tgid, e);
    } else {
        batched(b.tgid, e);
    }
    0
}

/// `memtrace_table_full_site(p)`: the shim's table of sampled addresses
/// had no room, so a sampled block was left out.
#[uprobe]
pub fn ml_preload_full(_ctx: ProbeContext) -> u32 {
    if traced(current_tgid()) {
        count_loss(loss::MAP_FULL);
    }
    0
}

/// `memtrace_hello_site(sample)`: a process loaded the shim.
#[uprobe]
pub fn ml_preload_hello(ctx: ProbeContext) -> u32 {
    if traced(current_tgid()) {
        match ctx.arg::<u64>(1) {
            Some(1) => bump(counter::UNPRELOADED),
            _ => bump(counter::PRELOADED),
        }
    }
    0
}
