//! `memleak`: allocations outstanding by stack. The kernel programs keep one
//! entry per live allocation (address -> size, time, stack) and per-stack
//! totals; userspace reads both at report time, so a hot allocation site
//! costs no ring-buffer traffic.

use crate::{stacks::StackKey, TASK_COMM_LEN};

/// How an allocator entry point passes its arguments, given to the entry
/// program as the probe's cookie: one program serves every function.
pub mod shape {
    /// `f(size)`: malloc, valloc.
    pub const SIZE: u64 = 1;
    /// `calloc(n, size)`.
    pub const CALLOC: u64 = 2;
    /// `realloc(ptr, size)`.
    pub const REALLOC: u64 = 3;
    /// `reallocarray(ptr, n, size)`.
    pub const REALLOCARRAY: u64 = 4;
    /// `f(align, size)`: memalign, aligned_alloc.
    pub const ALIGNED: u64 = 5;
    /// `posix_memalign(&ptr, align, size)`: the address is written to `*ptr`.
    pub const POSIX_MEMALIGN: u64 = 6;
    /// `pvalloc(size)`: the size is rounded up to pages.
    pub const PVALLOC: u64 = 7;
    /// An anonymous `mmap` outside the allocator (syscall tracepoints).
    pub const MMAP: u64 = 8;
}

/// What the allocation came from, part of its key: a page frame number and
/// a slab address can be the same number.
pub mod origin {
    pub const USER: u32 = 0;
    pub const MMAP: u32 = 1;
    pub const SLAB: u32 = 2;
    pub const PAGE: u32 = 3;
    pub const PERCPU: u32 = 4;
}

/// Indexes of the per-CPU `MEMLEAK_COUNTS`: what was seen, beside losses.
pub mod counter {
    pub const ALLOCS: u32 = 0;
    pub const FREES: u32 = 1;
    /// Frees of addresses not allocated while traced (before memtrace
    /// started, or not sampled): counted apart, never shown as anything.
    pub const FREE_UNKNOWN: u32 = 2;
    /// Allocations left out by `--sample-bytes`.
    pub const UNSAMPLED: u32 = 3;
    /// Outside `-z`/`-Z`.
    pub const OUT_OF_BOUNDS: u32 = 4;
    /// A call's entry found its thread's pending slot held by another
    /// thread's call in flight (the slots are indexed by thread id): that
    /// call's return is lost, and counted here.
    pub const PENDING_COLLISION: u32 = 5;
    /// Processes that loaded memleak's preloaded allocator shim.
    pub const PRELOADED: u32 = 6;
    /// Allocations the shim reported in a batch, their stack from the memo
    /// (`shim`), of them.
    pub const MEMOIZED: u32 = 7;
    /// Batched allocations whose block a free had already released (it
    /// came from another thread's batch first, `ML_EARLY_FREES`).
    pub const FREED_EARLY: u32 = 8;
    /// Children of the command exec'd with LD_PRELOAD removed from their
    /// environment (on purpose: `env -i`): the shim obeys, they are lost.
    pub const UNPRELOADED: u32 = 9;
    pub const NR: u32 = 10;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemleakConfig {
    /// Size bounds (`-z`, `-Z`); 0 for no upper bound.
    pub min_size: u64,
    pub max_size: u64,
    /// `--sample-bytes N`: 0 records every allocation; else an allocation
    /// of s bytes is kept with chance about 1 - e^(-s/N), weighted by the
    /// inverse of that chance (see [`SAMPLE_G`]).
    pub sample_bytes: u64,
    /// Tracepoint field offsets: `sys_enter_mmap` len and flags,
    /// `sys_exit_mmap`/`sys_exit_*` ret, `sys_enter_munmap` addr.
    pub mmap_len: u32,
    pub mmap_flags: u32,
    pub sys_ret: u32,
    pub munmap_addr: u32,
    /// kmem: `kmalloc`/`kmem_cache_alloc` ptr and bytes_alloc, `kfree` and
    /// `kmem_cache_free` ptr, `mm_page_alloc`/`mm_page_free` pfn and order,
    /// percpu ptr and bytes_alloc, `free_percpu` ptr.
    pub kmalloc_ptr: u32,
    pub kmalloc_bytes: u32,
    pub cache_alloc_ptr: u32,
    pub cache_alloc_bytes: u32,
    pub kfree_ptr: u32,
    pub cache_free_ptr: u32,
    pub page_alloc_pfn: u32,
    pub page_alloc_order: u32,
    pub page_free_pfn: u32,
    pub pcpu_alloc_ptr: u32,
    pub pcpu_alloc_bytes: u32,
    pub pcpu_free_ptr: u32,
    /// Bytes in a page, for page allocations.
    pub page_size: u32,
    /// Non-zero: the processes traced are those in the memory cgroups
    /// memcg watches (`MEMCG_WATCH`), whatever `FILTER` says (memcg --heap).
    pub by_group: u32,
    /// Non-zero: the shim is given the memo (`shim`), so its batches carry
    /// allocations, and a batched free may come before its block's.
    pub shim_memo: u32,
}

impl MemleakConfig {
    /// The value before userspace sets it (a `static` needs a const).
    pub const INIT: MemleakConfig = MemleakConfig {
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
        by_group: 0,
        shim_memo: 0,
    };
}

/// A call in flight, between an allocator's entry and its return.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PendingAlloc {
    pub size: u64,
    /// realloc's old pointer; posix_memalign's result pointer.
    pub ptr: u64,
    pub shape: u64,
    /// The stack pointer at entry: allocators call each other (glibc's
    /// realloc(NULL) calls malloc), and only the outermost call counts.
    pub sp: u64,
    /// What the allocation will stand for (allocations, bytes), decided at
    /// entry so that a session can skip the return of a call it does not
    /// record; 0 allocations: not recorded (only realloc's old block is).
    pub n: u64,
    pub bytes: u64,
}

/// Slots of the per-thread pending-call table, indexed by thread id modulo
/// this: thread ids are handed out in sequence, so live threads rarely share
/// a slot (a collision is counted).
pub const PENDING_SLOTS: u32 = 16384;

/// One slot of that table: whose call it holds (the thread's pid_tgid; 0
/// for none) and the call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PendingSlot {
    pub id: u64,
    pub call: PendingAlloc,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AllocKey {
    pub addr: u64,
    pub tgid: u32,
    pub origin: u32,
}

/// Sampling by the kernel programs (`-p`, `--no-preload`, anonymous mmaps):
/// an allocation of s bytes, x = s/N, is kept with chance x g, g =
/// (1 - e^(-y))/y at the top y of x's step of 1/`SAMPLE_STEP` (so just
/// under 1 - e^(-x), the chance the shim's exponential gaps give), in 2^-32;
/// at x of `SAMPLE_STEPS`/`SAMPLE_STEP` (16) or more, always. Its weight is
/// the inverse of the chance actually used: unbiased whatever the table's
/// precision.
pub const SAMPLE_STEP: u64 = 64;
pub const SAMPLE_STEPS: usize = 1024;
/// g in 2^-24 (integers only: the kernel programs have no floating point).
pub const SAMPLE_G: [u32; SAMPLE_STEPS] = sample_g();

const fn sample_g() -> [u32; SAMPLE_STEPS] {
    const ONE: u128 = 1 << 64;
    let mut g = [0u32; SAMPLE_STEPS];
    let mut i = 0;
    while i < SAMPLE_STEPS {
        // e^y, y = k/SAMPLE_STEP, by its series in 2^-64.
        let k = i as u128 + 1;
        let (mut term, mut e, mut n) = (ONE, ONE, 1u128);
        while term != 0 {
            term = term * k / (SAMPLE_STEP as u128 * n);
            e += term;
            n += 1;
        }
        // (1 - e^-y)/y = (e^y - 1)/(y e^y)
        g[i] = ((((e - ONE) * SAMPLE_STEP as u128) << 24) / (k * e)) as u32;
        i += 1;
    }
    g
}

/// One allocation, in the fixed point of weights (2^-16).
pub const WEIGHT_ONE: u64 = 1 << 16;

/// A live allocation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AllocInfo {
    pub size: u64,
    pub ts_ns: u64,
    /// What this allocation stands for: 1 and its size when exact; under
    /// `--sample-bytes` the inverse of its chance of being sampled, the
    /// count rounded up or down at random (right on average).
    pub weight: u64,
    pub weight_bytes: u64,
    pub stack: StackKey,
}

/// Per stack, per CPU: allocations and frees, in number and bytes (weighted).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AllocStats {
    pub allocs: u64,
    pub bytes: u64,
    pub frees: u64,
    pub freed_bytes: u64,
    pub comm: [u8; TASK_COMM_LEN],
}

/// The shim's batches (memtrace/preload/frees.c): at most this many
/// entries (`shim::BatchEntry`) in one report, each with the
/// CLOCK_MONOTONIC time of its call.
pub const FREE_BATCH: u32 = 64;

/// The shim's hot sites (memtrace/preload/sites.c): `memtrace_alloc_site_N`
/// and `memtrace_free_site_N` for N below this (5-byte nops), then the
/// unnumbered ones (never rewritten by the kernel).
pub const SITE_GENERATIONS: u32 = 8;

/// Where a batch's entries start (frees.c's `struct batch`: a u32 count,
/// a u32, a u64, then the entries).
pub const BATCH_ENTRIES_AT: u64 = 16;

crate::names! {
    maps {
        ML_PENDING: u32 => PendingSlot, OnDemand;
        ML_ALLOCS: AllocKey => AllocInfo, OnDemand;
        ML_STACKS: StackKey => AllocStats, OnDemand;
        ML_KALLOCS: AllocKey => AllocInfo, OnDemand;
        ML_KSTACKS: StackKey => AllocStats, OnDemand;
        ML_COUNTS: u32 => u64, OnDemand;
        ML_EXECS: u32 => u64, OnDemand;
        ML_BATCHES: u32 => u64, Compiled;
        ML_BLOCK: () => (), Compiled;
        ML_BATCH_READ: () => (), Compiled;
    }
    globals {
        MEMLEAK_CFG: MemleakConfig;
        // Read-only: sampling's chances by size, compiled in.
        ML_SAMPLE_G: [u32; SAMPLE_STEPS];
    }
    progs {
        ML_ALLOC_ENTER = ml_alloc_enter,
        ML_ENTER_SIZE = ml_enter_size,
        ML_ENTER_CALLOC = ml_enter_calloc,
        ML_ENTER_REALLOC = ml_enter_realloc,
        ML_ENTER_REALLOCARRAY = ml_enter_reallocarray,
        ML_ENTER_ALIGNED = ml_enter_aligned,
        ML_ENTER_POSIX_MEMALIGN = ml_enter_posix_memalign,
        ML_ENTER_PVALLOC = ml_enter_pvalloc,
        ML_ALLOC_RETURN = ml_alloc_return,
        ML_ALLOC_SESSION = ml_alloc_session,
        ML_FREE = ml_free,
        ML_MMAP_ENTER = ml_mmap_enter,
        ML_MMAP_EXIT = ml_mmap_exit,
        ML_MUNMAP = ml_munmap,
        ML_EXEC = ml_exec,
        ML_PRELOAD_ALLOC = ml_preload_alloc,
        ML_PRELOAD_FREE = ml_preload_free,
        ML_PRELOAD_FULL = ml_preload_full,
        ML_PRELOAD_HELLO = ml_preload_hello,
        ML_PRELOAD_FREES = ml_preload_frees,
        ML_PRELOAD_BATCH = ml_preload_batch,
        ML_BATCH_EXIT = ml_batch_exit,
        ML_KMALLOC = ml_kmalloc,
        ML_CACHE_ALLOC = ml_cache_alloc,
        ML_KFREE = ml_kfree,
        ML_CACHE_FREE = ml_cache_free,
        ML_PAGE_ALLOC = ml_page_alloc,
        ML_PAGE_FREE = ml_page_free,
        ML_PCPU_ALLOC = ml_pcpu_alloc,
        ML_PCPU_FREE = ml_pcpu_free,
    }
    /// For kernels without attach cookies: the entry program for each
    /// allocator shape (the cookie `ML_ALLOC_ENTER` reads elsewhere).
    pub const ML_ENTER_BY_SHAPE: &[(u64, Prog)] = &[
        (shape::SIZE, ML_ENTER_SIZE),
        (shape::CALLOC, ML_ENTER_CALLOC),
        (shape::REALLOC, ML_ENTER_REALLOC),
        (shape::REALLOCARRAY, ML_ENTER_REALLOCARRAY),
        (shape::ALIGNED, ML_ENTER_ALIGNED),
        (shape::POSIX_MEMALIGN, ML_ENTER_POSIX_MEMALIGN),
        (shape::PVALLOC, ML_ENTER_PVALLOC),
    ];
}

crate::pod!(MemleakConfig, PendingAlloc, AllocKey, AllocInfo, AllocStats);
