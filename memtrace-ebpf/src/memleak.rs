//! `memleak`: live allocations by stack. The allocator's entry saves the
//! request per thread, its return records the address with the stack (taken
//! there: the innermost frame is the caller, whatever the allocator's own
//! frame pointers), the free deletes it. Per-stack totals are kept beside,
//! so a report reads one small map unless it filters by age.

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_prandom_u32, bpf_ktime_get_ns,
        bpf_probe_read_user, generated::bpf_get_attach_cookie,
    },
    macros::{map, tracepoint, uprobe, uretprobe},
    maps::{HashMap, PerCpuArray, PerCpuHashMap},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
    EbpfContext, Global,
};
use memtrace_common::{
    loss,
    memleak::{
        counter, origin, shape, AllocInfo, AllocKey, AllocStats, MemleakConfig, PendingAlloc,
    },
    stacks::StackKey,
    TASK_COMM_LEN,
};

use crate::helpers::{
    bump_by_stack, capture_stacks, count_loss, current_tgid, tp_field, wanted, Stacks, NO_PREALLOC,
};

#[unsafe(no_mangle)]
static MEMLEAK_CFG: Global<MemleakConfig> = Global::new(MemleakConfig {
    min_size: 0,
    max_size: 0,
    sample_bytes: 0,
    mmap_len: 0,
    mmap_flags: 0,
    sys_ret: 0,
    munmap_addr: 0,
    kmalloc_ptr: 0,
    kmalloc_bytes: 0,
    cache_alloc_ptr: 0,
    cache_alloc_bytes: 0,
    kfree_ptr: 0,
    cache_free_ptr: 0,
    page_alloc_pfn: 0,
    page_alloc_order: 0,
    page_free_pfn: 0,
    pcpu_alloc_ptr: 0,
    pcpu_alloc_bytes: 0,
    pcpu_free_ptr: 0,
    page_size: 4096,
});

#[map]
static ML_PENDING: HashMap<u64, PendingAlloc> = HashMap::with_max_entries(1, NO_PREALLOC);
#[map]
static ML_ALLOCS: HashMap<AllocKey, AllocInfo> = HashMap::with_max_entries(1, NO_PREALLOC);
#[map]
static ML_STACKS: PerCpuHashMap<StackKey, AllocStats> =
    PerCpuHashMap::with_max_entries(1, NO_PREALLOC);
/// The same for kernel mode, preallocated: a program that allocates map
/// entries while tracing the kernel's allocators would trace itself (and
/// be skipped as recursion).
#[map]
static ML_KALLOCS: HashMap<AllocKey, AllocInfo> = HashMap::with_max_entries(1, 0);
#[map]
static ML_KSTACKS: PerCpuHashMap<StackKey, AllocStats> = PerCpuHashMap::with_max_entries(1, 0);
#[map]
static ML_COUNTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// Per CPU: bytes left before the next sampled allocation.
#[map]
static ML_SAMPLE: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

const MAP_ANONYMOUS: u64 = 0x20;

#[inline(always)]
fn bump(i: u32) {
    if let Some(p) = ML_COUNTS.get_ptr_mut(i) {
        unsafe { *p += 1 };
    }
}

/// Whether an allocation of `size` is recorded, and what it stands for
/// (allocations, bytes): everything in bounds when exact; under
/// `--sample-bytes N` about one per N bytes allocated, weighted by N.
#[inline(always)]
fn admit(size: u64) -> Option<(u64, u64)> {
    let c = MEMLEAK_CFG.load();
    if size < c.min_size || (c.max_size != 0 && size > c.max_size) {
        bump(counter::OUT_OF_BOUNDS);
        return None;
    }
    if c.sample_bytes == 0 {
        return Some((1, size));
    }
    let left = ML_SAMPLE.get_ptr_mut(0)?;
    unsafe {
        if *left > size {
            *left -= size;
            bump(counter::UNSAMPLED);
            return None;
        }
        // The next gap is uniform in [0, 2N): mean N, and no allocation
        // pattern lines up with a fixed period.
        let r = bpf_get_prandom_u32() as u64;
        // Never 0, so no division-by-zero panic path for the verifier to refuse.
        *left = r % (c.sample_bytes << 1).max(1);
    }
    if size >= c.sample_bytes {
        Some((1, size))
    } else {
        Some((c.sample_bytes.div_ceil(size.max(1)), c.sample_bytes))
    }
}

/// Where live allocations and per-stack totals are kept.
#[derive(Clone, Copy)]
struct Tables {
    allocs: &'static HashMap<AllocKey, AllocInfo>,
    stacks: &'static PerCpuHashMap<StackKey, AllocStats>,
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
    bump(counter::ALLOCS);
    let mut st = capture_stacks(ctx, size, 0);
    let mut key = StackKey {
        tgid,
        ustack: st.user,
        kstack: st.kern,
        ustack_check: st.user_check,
    };
    let (n, bytes) = weight;
    let set_user =
        |k: &mut StackKey, st: &Stacks| (k.ustack, k.ustack_check) = (st.user, st.user_check);
    let add = |v: &mut AllocStats| {
        v.allocs += n;
        v.bytes += bytes;
    };
    if !bump_by_stack(t.stacks, &mut key, &mut st, set_user, add) {
        let v = AllocStats {
            allocs: n,
            bytes,
            frees: 0,
            freed_bytes: 0,
            comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
        };
        if t.stacks.insert(&key, &v, 0).is_err() {
            count_loss(loss::MAP_FULL);
            return;
        }
    }
    let info = AllocInfo {
        size,
        ts_ns: unsafe { bpf_ktime_get_ns() },
        weight: n,
        weight_bytes: bytes,
        stack: key,
    };
    let k = AllocKey { addr, tgid, origin };
    if t.allocs.insert(&k, &info, 0).is_err() {
        // Not kept: take it out of the stack's totals again, so that no
        // figure claims what cannot be followed to its free.
        if let Some(v) = t.stacks.get_ptr_mut(&key) {
            let v = unsafe { &mut *v };
            v.frees += n;
            v.freed_bytes += bytes;
        }
        count_loss(loss::MAP_FULL);
    }
}

/// Deletes a live allocation; true when it was one.
#[inline(always)]
fn release(t: Tables, tgid: u32, addr: u64, origin: u32) -> bool {
    let k = AllocKey { addr, tgid, origin };
    let Some(info) = (unsafe { t.allocs.get(&k) }).copied() else {
        return false;
    };
    let _ = t.allocs.remove(&k);
    bump(counter::FREES);
    let (n, bytes) = (info.weight, info.weight_bytes);
    let sub = |v: &mut AllocStats| {
        v.frees += n;
        v.freed_bytes += bytes;
    };
    if let Some(v) = t.stacks.get_ptr_mut(&info.stack) {
        sub(unsafe { &mut *v });
    }
    true
}

#[inline(always)]
fn free_user(tgid: u32, addr: u64) {
    if addr != 0 && !release(USER, tgid, addr, origin::USER) && MEMLEAK_CFG.load().sample_bytes == 0
    {
        bump(counter::FREE_UNKNOWN);
    }
}

/// `x * y` for calloc-style requests. BPF has no 128-bit multiply, which
/// LLVM uses for any overflow check, so a factor of 4 GiB or more
/// saturates (such a request fails or is absurd anyway).
#[inline(always)]
fn mul(x: u64, y: u64) -> u64 {
    if x >> 32 == 0 && y >> 32 == 0 {
        x * y
    } else if x == 0 || y == 0 {
        0
    } else {
        u64::MAX
    }
}

/// Every allocator entry point: the request, by the function's shape (the
/// probe's cookie), kept until its return.
#[uprobe]
pub fn ml_alloc_enter(ctx: ProbeContext) -> u32 {
    if !wanted(current_tgid()) {
        return 0;
    }
    let shape = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let a = |n| ctx.arg::<u64>(n).unwrap_or(0);
    let (size, ptr) = match shape {
        shape::CALLOC => (mul(a(0), a(1)), 0),
        shape::REALLOC => (a(1), a(0)),
        shape::REALLOCARRAY => (mul(a(1), a(2)), a(0)),
        shape::ALIGNED => (a(1), 0),
        shape::POSIX_MEMALIGN => (a(2), a(0)),
        shape::PVALLOC => {
            let p = MEMLEAK_CFG.load().page_size as u64;
            (a(0).div_ceil(p.max(1)) * p, 0)
        }
        _ => (a(0), 0),
    };
    let id = bpf_get_current_pid_tgid();
    let sp = unsafe { (*ctx.regs).rsp };
    if let Some(outer) = unsafe { ML_PENDING.get(&id) } {
        if sp <= outer.sp {
            // Called by the allocator itself (at the same stack pointer: a
            // tail call, as glibc's realloc(NULL, n) jumps to malloc): part
            // of the outer call.
            return 0;
        }
        // A call above the pending one: its return never came (longjmp).
        count_loss(loss::MISSED_RETURN);
    }
    let p = PendingAlloc {
        size,
        ptr,
        shape,
        sp,
    };
    if ML_PENDING.insert(&id, &p, 0).is_err() {
        count_loss(loss::MAP_FULL);
    }
    0
}

#[uretprobe]
pub fn ml_alloc_return(ctx: RetProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let Some(p) = (unsafe { ML_PENDING.get(&id) }).copied() else {
        return 0;
    };
    // The return of an inner call (its stack pointer is below the outer
    // call's): the outer return records the allocation.
    if unsafe { (*ctx.regs).rsp } <= p.sp {
        return 0;
    }
    let _ = ML_PENDING.remove(&id);
    let tgid = (id >> 32) as u32;
    let ret: u64 = ctx.ret();
    let addr = match p.shape {
        shape::POSIX_MEMALIGN if ret == 0 => unsafe { bpf_probe_read_user(p.ptr as *const u64) }
            .unwrap_or_else(|_| {
                count_loss(loss::READ);
                0
            }),
        shape::POSIX_MEMALIGN => 0,
        _ => ret,
    };
    // The old block is gone once the new one is there (or asked to be
    // freed): not counted as unknown when not tracked, since glibc's
    // realloc(p, 0) frees it through free itself, first.
    if matches!(p.shape, shape::REALLOC | shape::REALLOCARRAY)
        && (addr != 0 || p.size == 0)
        && p.ptr != 0
    {
        release(USER, tgid, p.ptr, origin::USER);
    }
    if addr == 0 {
        return 0;
    }
    if let Some(w) = admit(p.size) {
        record(&ctx, USER, tgid, addr, p.size, origin::USER, w);
    }
    0
}

#[uprobe]
pub fn ml_free(ctx: ProbeContext) -> u32 {
    let tgid = current_tgid();
    if wanted(tgid) {
        free_user(tgid, ctx.arg::<u64>(0).unwrap_or(0));
    }
    0
}

/// An exec ends every call in flight in the old image: their returns never
/// come (a `-c` command's own exec starts inside one).
#[tracepoint]
pub fn ml_exec(_ctx: TracePointContext) -> u32 {
    let _ = ML_PENDING.remove(&bpf_get_current_pid_tgid());
    0
}

/// Anonymous mmap outside the allocator (whose own mmaps are its blocks).
#[tracepoint]
pub fn ml_mmap_enter(ctx: TracePointContext) -> u32 {
    if !wanted(current_tgid()) {
        return 0;
    }
    let c = MEMLEAK_CFG.load();
    let flags: u64 = tp_field(&ctx, c.mmap_flags);
    let id = bpf_get_current_pid_tgid();
    if flags & MAP_ANONYMOUS == 0 || unsafe { ML_PENDING.get(&id) }.is_some() {
        return 0;
    }
    let p = PendingAlloc {
        size: tp_field(&ctx, c.mmap_len),
        ptr: 0,
        shape: shape::MMAP,
        sp: 0,
    };
    if ML_PENDING.insert(&id, &p, 0).is_err() {
        count_loss(loss::MAP_FULL);
    }
    0
}

#[tracepoint]
pub fn ml_mmap_exit(ctx: TracePointContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let Some(p) = (unsafe { ML_PENDING.get(&id) }).copied() else {
        return 0;
    };
    if p.shape != shape::MMAP {
        return 0;
    }
    let _ = ML_PENDING.remove(&id);
    let ret: i64 = tp_field(&ctx, MEMLEAK_CFG.load().sys_ret);
    if ret <= 0 && ret > -4096 {
        return 0;
    }
    if let Some(w) = admit(p.size) {
        record(
            &ctx,
            USER,
            (id >> 32) as u32,
            ret as u64,
            p.size,
            origin::MMAP,
            w,
        );
    }
    0
}

#[tracepoint]
pub fn ml_munmap(ctx: TracePointContext) -> u32 {
    let tgid = current_tgid();
    if wanted(tgid) {
        // Only whole mappings memtrace saw made; anything else is not an
        // allocation it tracks.
        release(
            USER,
            tgid,
            tp_field(&ctx, MEMLEAK_CFG.load().munmap_addr),
            origin::MMAP,
        );
    }
    0
}

// Kernel mode: the kmem tracepoints, by kernel stack; tgid 0 for all.

#[inline(always)]
fn kalloc(ctx: &TracePointContext, ptr_off: u32, size: u64, origin: u32) {
    let addr: u64 = tp_field(ctx, ptr_off);
    if addr == 0 {
        return;
    }
    if let Some(w) = admit(size) {
        record(ctx, KERNEL, 0, addr, size, origin, w);
    }
}

#[inline(always)]
fn kfree(ctx: &TracePointContext, ptr_off: u32, origin: u32) {
    let addr: u64 = tp_field(ctx, ptr_off);
    if addr != 0 && !release(KERNEL, 0, addr, origin) && MEMLEAK_CFG.load().sample_bytes == 0 {
        bump(counter::FREE_UNKNOWN);
    }
}

#[tracepoint]
pub fn ml_kmalloc(ctx: TracePointContext) -> u32 {
    let c = MEMLEAK_CFG.load();
    kalloc(
        &ctx,
        c.kmalloc_ptr,
        tp_field(&ctx, c.kmalloc_bytes),
        origin::SLAB,
    );
    0
}

#[tracepoint]
pub fn ml_cache_alloc(ctx: TracePointContext) -> u32 {
    let c = MEMLEAK_CFG.load();
    kalloc(
        &ctx,
        c.cache_alloc_ptr,
        tp_field(&ctx, c.cache_alloc_bytes),
        origin::SLAB,
    );
    0
}

#[tracepoint]
pub fn ml_kfree(ctx: TracePointContext) -> u32 {
    kfree(&ctx, MEMLEAK_CFG.load().kfree_ptr, origin::SLAB);
    0
}

#[tracepoint]
pub fn ml_cache_free(ctx: TracePointContext) -> u32 {
    kfree(&ctx, MEMLEAK_CFG.load().cache_free_ptr, origin::SLAB);
    0
}

#[tracepoint]
pub fn ml_page_alloc(ctx: TracePointContext) -> u32 {
    let c = MEMLEAK_CFG.load();
    let order: u32 = tp_field(&ctx, c.page_alloc_order);
    let size = (c.page_size as u64) << (order & 31);
    kalloc(&ctx, c.page_alloc_pfn, size, origin::PAGE);
    0
}

#[tracepoint]
pub fn ml_page_free(ctx: TracePointContext) -> u32 {
    kfree(&ctx, MEMLEAK_CFG.load().page_free_pfn, origin::PAGE);
    0
}

#[tracepoint]
pub fn ml_pcpu_alloc(ctx: TracePointContext) -> u32 {
    let c = MEMLEAK_CFG.load();
    kalloc(
        &ctx,
        c.pcpu_alloc_ptr,
        tp_field(&ctx, c.pcpu_alloc_bytes),
        origin::PERCPU,
    );
    0
}

#[tracepoint]
pub fn ml_pcpu_free(ctx: TracePointContext) -> u32 {
    kfree(&ctx, MEMLEAK_CFG.load().pcpu_free_ptr, origin::PERCPU);
    0
}
