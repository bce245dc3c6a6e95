//! `memleak`: live allocations by stack. The allocator's entry saves the
//! request per thread, its return records the address with the stack (taken
//! there: the innermost frame is the caller, whatever the allocator's own
//! frame pointers), the free deletes it. Per-stack totals are kept beside,
//! so a report reads one small map unless it filters by age.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_prandom_u32, bpf_ktime_get_ns},
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
    Global,
};
use memtrace_common::{
    memleak::{
        counter, AllocInfo, AllocKey, AllocStats, MemleakConfig, PendingAlloc, PendingSlot,
        PENDING_SLOTS, SAMPLE_G, SAMPLE_STEP, SAMPLE_STEPS, WEIGHT_ONE,
    },
    stacks::StackKey,
    TASK_COMM_LEN,
};

use crate::helpers::{
    atomic_add, bump_by_stack, capture_stacks, count_refused, Stacks, NO_PREALLOC,
};

mod batched;
mod kernel;
mod memo;
mod preload;
mod user;

/// The block being recorded, per CPU (see `record_stacks`).
#[map]
static ML_BLOCK: PerCpuArray<(AllocKey, AllocInfo)> = PerCpuArray::with_max_entries(1, 0);

#[unsafe(no_mangle)]
static MEMLEAK_CFG: Global<MemleakConfig> = Global::new(MemleakConfig::INIT);

/// Calls in flight, one slot per thread (by thread id): an array slot is a
/// few instructions where a hash insert allocated, and a thread has one
/// outermost call in flight at a time.
#[map]
static ML_PENDING: Array<PendingSlot> = Array::with_max_entries(PENDING_SLOTS, 0);
#[map]
static ML_ALLOCS: HashMap<AllocKey, AllocInfo> = HashMap::with_max_entries(1, NO_PREALLOC);
/// Totals by stack, one value shared by the CPUs and added to atomically
/// (`tally`): a per-CPU value is allocated from per-CPU memory where the
/// event fires, which a burst of new stacks on a loaded host finds empty
/// (the insert fails), and costs a value per CPU for every stack.
#[map]
static ML_STACKS: HashMap<StackKey, AllocStats> = HashMap::with_max_entries(1, NO_PREALLOC);
/// The same for kernel mode, preallocated: a program that allocates map
/// entries while tracing the kernel's allocators would trace itself (and
/// be skipped as recursion).
#[map]
static ML_KALLOCS: HashMap<AllocKey, AllocInfo> = HashMap::with_max_entries(1, 0);
#[map]
static ML_KSTACKS: HashMap<StackKey, AllocStats> = HashMap::with_max_entries(1, 0);
#[map]
static ML_COUNTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// Followed processes that exec'd, with when: the blocks of the image they
/// left are gone (userspace takes them out).
#[map]
static ML_EXECS: HashMap<u32, u64> = HashMap::with_max_entries(1, 0);
/// Sampling's chances by size (memtrace-common's table), read-only data.
#[unsafe(no_mangle)]
static ML_SAMPLE_G: [u32; SAMPLE_STEPS] = SAMPLE_G;

/// The pending slot of thread `id` (pid_tgid), whoever holds it.
#[inline(always)]
fn pending_slot(id: u64) -> Option<&'static mut PendingSlot> {
    let p = ML_PENDING.get_ptr_mut(id as u32 % PENDING_SLOTS)?;
    Some(unsafe { &mut *p })
}

/// Thread `id`'s call in flight, if any.
#[inline(always)]
fn pending(id: u64) -> Option<&'static mut PendingSlot> {
    pending_slot(id).filter(|s| s.id == id)
}

/// Keeps `call` as thread `id`'s call in flight; a slot another thread's
/// call still holds is taken over, and counted.
#[inline(always)]
fn set_pending(id: u64, call: PendingAlloc) {
    if let Some(s) = pending_slot(id) {
        if s.id != 0 && s.id != id {
            bump(counter::PENDING_COLLISION);
        }
        s.id = id;
        s.call = call;
    }
}

#[inline(always)]
fn bump(i: u32) {
    add(i, 1);
}

#[inline(always)]
fn add(i: u32, n: u64) {
    if n == 0 {
        return;
    }
    if let Some(p) = ML_COUNTS.get_ptr_mut(i) {
        unsafe { *p += n };
    }
}

/// Whether an allocation of `size` is within `-z`/`-Z` (counted when not).
#[inline(always)]
fn in_bounds(c: &MemleakConfig, size: u64) -> bool {
    if size < c.min_size || (c.max_size != 0 && size > c.max_size) {
        bump(counter::OUT_OF_BOUNDS);
        return false;
    }
    true
}

/// What an allocation of `size` sampled at weight `w` (the inverse of its
/// chance, in 2^-16) stands for (allocations, bytes): the count is rounded
/// up or down at random, so that it is right on average, and kept with the
/// block, so that its free takes out what it put in.
#[inline(always)]
fn weighed(size: u64, w: u64) -> (u64, u64) {
    if w <= WEIGHT_ONE {
        return (1, size);
    }
    let up = (unsafe { bpf_get_prandom_u32() } as u64 & 0xffff) < (w & 0xffff);
    ((w >> 16) + up as u64, (size * w + 0x8000) >> 16)
}

/// An allocation already sampled (by the preloaded shim, which weighed it):
/// what it stands for, if in bounds.
#[inline(always)]
fn weigh(size: u64, w: u64) -> Option<(u64, u64)> {
    let c = MEMLEAK_CFG.load();
    in_bounds(&c, size).then(|| weighed(size, w))
}

/// Whether an allocation of `size` is recorded, and what it stands for
/// (allocations, bytes): everything in bounds when exact; under
/// `--sample-bytes N` each with chance about 1 - e^(-size/N) (memtrace-common's
/// SAMPLE_G), on its own, weighted by the inverse of the chance used.
#[inline(always)]
fn admit(size: u64) -> Option<(u64, u64)> {
    let c = MEMLEAK_CFG.load();
    if !in_bounds(&c, size) {
        return None;
    }
    // Never 0 below, so no division-by-zero path for the verifier to refuse.
    let n = c.sample_bytes.max(1);
    if c.sample_bytes == 0 || size >= SAMPLE_STEPS as u64 / SAMPLE_STEP * n {
        return Some((1, size));
    }
    let g = *ML_SAMPLE_G.get((size * SAMPLE_STEP / n) as usize)? as u64;
    let num = size * g; // below 16 N 2^24
    let p = if num >> 56 == 0 {
        (num << 8) / n
    } else {
        (num / n) << 8
    };
    let p = p.clamp(1, 1 << 32);
    if unsafe { bpf_get_prandom_u32() } as u64 >= p {
        bump(counter::UNSAMPLED);
        return None;
    }
    Some(weighed(size, (1 << 48) / p))
}

/// Where live allocations and per-stack totals are kept.
#[derive(Clone, Copy)]
struct Tables {
    allocs: &'static HashMap<AllocKey, AllocInfo>,
    stacks: &'static HashMap<StackKey, AllocStats>,
}

const USER: Tables = Tables {
    allocs: &ML_ALLOCS,
    stacks: &ML_STACKS,
};
const KERNEL: Tables = Tables {
    allocs: &ML_KALLOCS,
    stacks: &ML_KSTACKS,
};

/// Records a live allocation at `addr` with the current stacks.
#[inline(always)]
fn record<C: aya_ebpf::programs::tracing::StackIdContext>(
    ctx: &C,
    t: Tables,
    tgid: u32,
    addr: u64,
    size: u64,
    origin: u32,
    weight: (u64, u64),
) {
    let st = capture_stacks(ctx, size, 0);
    record_stacks(t, tgid, addr, size, origin, weight, st);
}

/// `record` with the stacks already taken: a program that takes them
/// before its other branches has the verifier walk the unwinder once.
#[inline(always)]
fn record_stacks(
    t: Tables,
    tgid: u32,
    addr: u64,
    size: u64,
    origin: u32,
    weight: (u64, u64),
    mut st: Stacks,
) -> Option<(i32, u32)> {
    bump(counter::ALLOCS);
    let mut key = StackKey {
        tgid,
        ustack: st.user,
        kstack: st.kern,
        ustack_check: st.user_check,
        gen: 0,
        forked: 0,
    };
    let (n, bytes) = weight;
    let set_user =
        |k: &mut StackKey, st: &Stacks| (k.ustack, k.ustack_check) = (st.user, st.user_check);
    let add = |_: &StackKey, v: &mut AllocStats| tally(v, n, bytes);
    if !bump_by_stack(t.stacks, &mut key, &mut st, set_user, add) {
        let v = AllocStats {
            allocs: n,
            bytes,
            frees: 0,
            freed_bytes: 0,
            comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
        };
        if let Err(e) = t.stacks.insert(&key, &v, 0) {
            count_refused(e);
            return None;
        }
    }
    // Built in a per-CPU slot, not on this program's stack, which the
    // unwinder's calls leave little of (6.1: 512 bytes for the chain).
    let slot = unsafe { &mut *ML_BLOCK.get_ptr_mut(0)? };
    slot.0 = AllocKey { addr, tgid, origin };
    slot.1 = AllocInfo {
        size,
        ts_ns: unsafe { bpf_ktime_get_ns() },
        weight: n,
        weight_bytes: bytes,
        stack: key,
    };
    keep(core::ptr::eq(t.allocs, &ML_KALLOCS)).then_some((key.ustack, key.ustack_check))
}

/// Puts the block in `ML_BLOCK` in the table. An address handed out again
/// means its old block was freed, and that free is in a batch not yet
/// reported (the shim's) or was missed: the old block is released, so its
/// stack's figures do not keep it, and the new one takes its entry in
/// place (glibc hands a freed block straight back: one lookup where a
/// delete and an insert were). A block the full table cannot take comes
/// out of its stack's totals again, so that no figure claims what cannot
/// be followed to its free. The block is in a map, not on the stack:
/// beside the unwinder's calls, 6.1 has 512 bytes for the chain.
#[inline(always)]
fn keep(kernel: bool) -> bool {
    let t = if kernel { KERNEL } else { USER };
    let Some(slot) = ML_BLOCK.get_ptr(0) else {
        return false;
    };
    let (k, info) = unsafe { &*slot };
    if let Some(old) = t.allocs.get_ptr_mut(k) {
        let old = unsafe { &mut *old };
        settle(t, old);
        bump(counter::FREES);
        // Not `*old = *info`: two map pointers, so LLVM called a memmove,
        // which copies byte by byte in BPF (about 20 ns here).
        unsafe { core::ptr::copy_nonoverlapping(info as *const AllocInfo, old, 1) };
        return true;
    }
    let Err(e) = t.allocs.insert(k, info, 0) else {
        return true;
    };
    settle(t, info);
    count_refused(e);
    false
}

/// Takes a block out of its stack's figures (its free).
#[inline(always)]
fn settle(t: Tables, info: &AllocInfo) {
    if let Some(v) = t.stacks.get_ptr_mut(&info.stack) {
        tally_freed(unsafe { &mut *v }, info.weight, info.weight_bytes);
    }
}

/// Adds `n` blocks of `bytes` in all to a stack's figures, which every CPU
/// writes.
#[inline(always)]
fn tally(v: &mut AllocStats, n: u64, bytes: u64) {
    atomic_add(&mut v.allocs, n);
    atomic_add(&mut v.bytes, bytes);
}

/// Takes `n` blocks of `bytes` in all out of a stack's figures (freed).
#[inline(always)]
fn tally_freed(v: &mut AllocStats, n: u64, bytes: u64) {
    atomic_add(&mut v.frees, n);
    atomic_add(&mut v.freed_bytes, bytes);
}

/// Whether a block is in the table (a realloc that is not sampled needs its
/// return only to release a block that is).
#[inline(always)]
fn tracked(t: Tables, tgid: u32, addr: u64, origin: u32) -> bool {
    unsafe { t.allocs.get(&AllocKey { addr, tgid, origin }) }.is_some()
}

/// A batched free at `ts`: the block there is released only if it was
/// allocated before (else the address was handed out again since, and that
/// allocation released the block this free was for).
// The compat object's batches (frees only); with the memo, `batched`.
#[cfg(feature = "compat")]
#[inline(always)]
fn release_before(t: Tables, tgid: u32, addr: u64, ts: u64) {
    let k = AllocKey {
        addr,
        tgid,
        origin: memtrace_common::memleak::origin::USER,
    };
    if release_if(t, &k, ts) == Released::None {
        bump(counter::FREE_UNKNOWN);
    }
}

/// Deletes a live allocation; true when it was one.
#[inline(always)]
fn release(t: Tables, tgid: u32, addr: u64, origin: u32) -> bool {
    release_at(t, &AllocKey { addr, tgid, origin })
}

/// `release` by a key anywhere (a map's slot too). Read in place, not
/// copied: the allocation programs' stack is short beside the unwinder.
#[inline(always)]
fn release_at(t: Tables, k: &AllocKey) -> bool {
    release_if(t, k, u64::MAX) == Released::Yes
}

#[derive(PartialEq, Eq)]
enum Released {
    Yes,
    /// The block there was allocated after `not_after`: kept.
    Newer,
    None,
}

/// `release_at` of a block allocated at `not_after` or before, with one
/// lookup of the table.
#[inline(always)]
fn release_if(t: Tables, k: &AllocKey, not_after: u64) -> Released {
    let Some(info) = t.allocs.get_ptr(k) else {
        return Released::None;
    };
    let info = unsafe { &*info };
    if info.ts_ns > not_after {
        return Released::Newer;
    }
    settle(t, info);
    let _ = t.allocs.remove(k);
    bump(counter::FREES);
    Released::Yes
}
