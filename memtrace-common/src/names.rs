//! Names of the eBPF object's programs, maps and globals, defined once.
//!
//! The kernel crate declares them as statics and functions (aya's macros
//! take the Rust identifier as the name); userspace refers to them only
//! through these typed constants, so a global is always written with its own
//! type and a map read with its own key and value. A unit test in memtrace
//! checks both ways against the built object: every name here exists there,
//! and every program, map and global there is named here (a map missing from
//! this list would otherwise keep its compiled size in every tool).

use core::marker::PhantomData;

use crate::{
    exemaps::{ExeMapPending, ExeMapsConfig},
    faults::{FaultConfig, FaultKey, FaultSlot, FaultVal},
    ffaults::{FfaultsConfig, FileKey},
    generic::{CountKey, CountVal, TpConfig},
    kunwind::{UnwindFile, UnwindFileKey, UnwindProc, UnwindRule, VmaOffsets},
    memcg::{MemcgLine, MemcgOffsets, MemcgProc},
    memleak::{AllocInfo, AllocKey, AllocStats, MemleakConfig, PendingSlot, SAMPLE_STEPS},
    oom::{OomKprobeOffsets, OomTpOffsets},
    reclaim::{ProcReclaimKey, ProcReclaimVal, ReclaimConfig, ReclaimTotals},
    rss::{RssConfig, RssVal},
    snoop::{MmapSnoopConfig, PendingCall, ShmSnoopConfig},
    stacks::{BrkConfig, ImageOffsets, StackKey, StackVal, UserStack, UstackConfig},
    top::{MmapCount, TopConfig},
    ExecName, Filter, ProcKey, TaskOffsets,
};

/// How a map is sized when the object is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sizing {
    /// As compiled: every tool uses it (loss counters, per-CPU scratch).
    Compiled,
    /// One entry unless the tool sizes it: most maps serve one tool, and an
    /// unused map costs locked kernel memory and start-up time.
    OnDemand,
}

/// A map's name with its key and value types (`()` for maps userspace
/// never reads entry by entry: ring buffers, stack traces, scratch).
pub struct MapName<K, V> {
    pub name: &'static str,
    pub sizing: Sizing,
    _kv: PhantomData<fn() -> (K, V)>,
}

impl<K, V> MapName<K, V> {
    pub const fn new(name: &'static str, sizing: Sizing) -> Self {
        MapName {
            name,
            sizing,
            _kv: PhantomData,
        }
    }
}

impl<K, V> Clone for MapName<K, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K, V> Copy for MapName<K, V> {}

/// A global (`.rodata`/`.bss` variable set before load) with its type.
pub struct GlobalName<T> {
    pub name: &'static str,
    _t: PhantomData<fn() -> T>,
}

impl<T> GlobalName<T> {
    pub const fn new(name: &'static str) -> Self {
        GlobalName {
            name,
            _t: PhantomData,
        }
    }
}

impl<T> Clone for GlobalName<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for GlobalName<T> {}

/// A program in the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Prog(pub &'static str);

macro_rules! maps {
    ($($name:ident: $k:ty => $v:ty, $sizing:ident;)*) => {
        $(pub const $name: MapName<$k, $v> = MapName::new(stringify!($name), Sizing::$sizing);)*
        /// Every map of the object with its sizing policy.
        pub const ALL_MAPS: &[(&str, Sizing)] = &[$((stringify!($name), Sizing::$sizing)),*];
    };
}

macro_rules! globals {
    ($($name:ident: $t:ty;)*) => {
        $(pub const $name: GlobalName<$t> = GlobalName::new(stringify!($name));)*
        pub const ALL_GLOBALS: &[&str] = &[$(stringify!($name)),*];
    };
}

macro_rules! progs {
    ($($name:ident = $prog:ident,)*) => {
        $(pub const $name: Prog = Prog(stringify!($prog));)*
        pub const ALL_PROGS: &[Prog] = &[$($name),*];
    };
}

maps! {
    // Shared by every tool.
    EVENTS: () => (), Compiled;
    LOSSES: u32 => u64, Compiled;
    COUNT_GEN: u32 => u32, Compiled;
    BUSY: u32 => u32, Compiled;
    SAMPLE_TICK: u32 => u32, Compiled;
    WALK_SCRATCH: () => (), Compiled;
    FP_STEP: () => (), Compiled;
    UNWIND_STEP: () => (), Compiled;
    SAMPLE_SCRATCH: () => (), OnDemand;
    STACKS: u32 => (), OnDemand;
    USTACKS: u32 => UserStack, OnDemand;
    UNWIND_ROWS: u32 => u64, OnDemand;
    UNWIND_RULES: u32 => UnwindRule, OnDemand;
    UNWIND_PROCS: u32 => UnwindProc, OnDemand;
    UNWIND_MISSES: u32 => u8, OnDemand;
    UNWIND_FILES: UnwindFileKey => UnwindFile, OnDemand;
    VMA_FOUND: () => (), Compiled;
    UNWIND_STATS: u32 => u64, Compiled;
    UNWIND_CACHE: () => (), OnDemand;
    FOLLOWED: u32 => u8, OnDemand;
    EXEC_NAMES: u32 => ExecName, OnDemand;
    EXEMAP_PENDING: u32 => ExeMapPending, OnDemand;
    SNOOP_PENDING: u32 => PendingCall, OnDemand;
    // One tool each.
    BRK_STACKS: StackKey => StackVal, OnDemand;
    FAULTS: FaultKey => FaultVal, OnDemand;
    FAULTS_PERF: FaultKey => FaultVal, OnDemand;
    FAULT_SLOTS: u32 => FaultSlot, OnDemand;
    FAULT_SLOT_FREE: u32 => u32, OnDemand;
    FAULT_SPILL: u32 => u64, Compiled;
    FILE_FAULTS: FileKey => u64, OnDemand;
    FILES_SEEN: FileKey => u8, OnDemand;
    SWAPINS: ProcKey => FaultVal, OnDemand;
    RECLAIM_START: u32 => [u64; 2], OnDemand;
    SLAB_START: u32 => u64, OnDemand;
    RECLAIM_TOTALS: u32 => ReclaimTotals, Compiled;
    PROC_RECLAIM: ProcReclaimKey => ProcReclaimVal, OnDemand;
    MEMCG_RECLAIM: u64 => ProcReclaimVal, OnDemand;
    MEMCG_WATCH: u64 => u8, OnDemand;
    MEMCG_PROCS: u32 => MemcgProc, OnDemand;
    MEMCG_LINES: u64 => MemcgLine, OnDemand;
    RSS: u32 => RssVal, OnDemand;
    RSS_OWNER: u32 => u32, OnDemand;
    RSS_EXCLUDED: u32 => u64, OnDemand;
    COUNT_TPS: u32 => TpConfig, OnDemand;
    COUNTS: CountKey => CountVal, OnDemand;
    TRACE_SCRATCH: () => (), Compiled;
    OOM_SCRATCH: () => (), Compiled;
    ML_PENDING: u32 => PendingSlot, OnDemand;
    ML_ALLOCS: AllocKey => AllocInfo, OnDemand;
    ML_STACKS: StackKey => AllocStats, OnDemand;
    ML_KALLOCS: AllocKey => AllocInfo, OnDemand;
    ML_KSTACKS: StackKey => AllocStats, OnDemand;
    ML_COUNTS: u32 => u64, OnDemand;
    ML_EXECS: u32 => u64, OnDemand;
    ML_BATCHES: u32 => u64, Compiled;
    ML_BLOCK: () => (), Compiled;
    MMAP_COUNTS: ProcKey => MmapCount, OnDemand;
}

globals! {
    FILTER: Filter;
    TASK: TaskOffsets;
    IMAGE: ImageOffsets;
    USTACK: UstackConfig;
    UNWIND_VMA: VmaOffsets;
    WAKE_BYTES: u64;
    BRK_CFG: BrkConfig;
    FAULT_CFG: FaultConfig;
    FFAULT_CFG: FfaultsConfig;
    OOM_TP: OomTpOffsets;
    OOM_CONTROL: OomKprobeOffsets;
    OOM_STACKS: u32;
    RECLAIM_CFG: ReclaimConfig;
    RSS_CFG: RssConfig;
    MEMCG_CFG: RssConfig;
    MEMCG_OFFS: MemcgOffsets;
    MMAP_SNOOP: MmapSnoopConfig;
    SHM_SNOOP: ShmSnoopConfig;
    MEMLEAK_CFG: MemleakConfig;
    // Read-only: sampling's chances by size, compiled in from memleak.rs.
    ML_SAMPLE_G: [u32; SAMPLE_STEPS];
    TOP_CFG: TopConfig;
    EXEMAPS_CFG: ExeMapsConfig;
}

progs! {
    // Shared.
    FOLLOW_FORK = follow_fork,
    NAME_EXEC = name_exec,
    UNWIND_EXIT = unwind_exit,
    EXEMAP_ENTER = exemap_enter,
    EXEMAP_EXIT = exemap_exit,
    EXEMAP_EXEC = exemap_exec,
    FLOOR_TP = floor_tp,
    FLOOR_RAW = floor_raw,
    // brkstack.
    BRK_ENTER = brk_enter,
    // faults.
    FAULTS_USER_BTF = faults_user_btf,
    FAULTS_KERNEL_BTF = faults_kernel_btf,
    FAULTS_RAW = faults_raw,
    FAULTS_USER_TP = faults_user_tp,
    FAULTS_KERNEL_TP = faults_kernel_tp,
    FAULTS_PERF_PROG = faults_perf,
    // ffaults.
    FFAULTS_TP = ffaults_tp,
    FFAULTS_KPROBE = ffaults_kprobe,
    FFAULTS_FENTRY = ffaults_fentry,
    // oomkill.
    OOM_KPROBE = oom_kprobe,
    OOM_FENTRY = oom_fentry,
    OOM_RAW_TP = oom_raw_tp,
    OOM_TP_BTF = oom_tp_btf,
    OOM_TRACEPOINT = oom_tracepoint,
    // vmscan, drsnoop.
    DIRECT_RECLAIM_BEGIN = direct_reclaim_begin,
    MEMCG_RECLAIM_BEGIN = memcg_reclaim_begin,
    RECLAIM_END = reclaim_end,
    SHRINK_SLAB_START = shrink_slab_start,
    SHRINK_SLAB_END = shrink_slab_end,
    KSWAPD_WAKE = kswapd_wake,
    RECLAIM_WRITE = reclaim_write,
    // rss.
    RSS_STAT = rss_stat,
    // memcg.
    MEMCG_RSS = memcg_rss,
    MEMCG_LINE = memcg_line,
    // swapin.
    SWAPIN_KPROBE = swapin_kprobe,
    SWAPIN_FENTRY = swapin_fentry,
    // mmapsnoop.
    MMAP_ENTER = mmap_enter,
    MMAP_EXIT = mmap_exit,
    MUNMAP_ENTER = munmap_enter,
    MUNMAP_EXIT = munmap_exit,
    MREMAP_ENTER = mremap_enter,
    MREMAP_EXIT = mremap_exit,
    SNOOP_BRK_ENTER = snoop_brk_enter,
    SNOOP_BRK_EXIT = snoop_brk_exit,
    // shmsnoop.
    SHMGET_ENTER = shmget_enter,
    SHMGET_EXIT = shmget_exit,
    SHMAT_ENTER = shmat_enter,
    SHMAT_EXIT = shmat_exit,
    SHMDT_ENTER = shmdt_enter,
    SHMDT_EXIT = shmdt_exit,
    SHMCTL_ENTER = shmctl_enter,
    SHMCTL_EXIT = shmctl_exit,
    // count, trace.
    COUNT_TP = count_tp,
    COUNT_ONE = count_one,
    COUNT_AT1 = count_at1,
    COUNT_AT2 = count_at2,
    COUNT_AT3 = count_at3,
    COUNT_AT4 = count_at4,
    COUNT_AT5 = count_at5,
    COUNT_AT6 = count_at6,
    COUNT_AT7 = count_at7,
    TRACE_TP = trace_tp,
    TRACE_ONE = trace_one,
    TRACE_AT1 = trace_at1,
    TRACE_AT2 = trace_at2,
    TRACE_AT3 = trace_at3,
    TRACE_AT4 = trace_at4,
    TRACE_AT5 = trace_at5,
    TRACE_AT6 = trace_at6,
    TRACE_AT7 = trace_at7,
    // memleak.
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
    // top, serve.
    TOP_MMAP = top_mmap,
}

/// For kernels without attach cookies (before 5.15): count's and trace's
/// program for each place in the list of tracepoints.
pub const COUNT_AT: [Prog; 8] = [
    COUNT_ONE, COUNT_AT1, COUNT_AT2, COUNT_AT3, COUNT_AT4, COUNT_AT5, COUNT_AT6, COUNT_AT7,
];
pub const TRACE_AT: [Prog; 8] = [
    TRACE_ONE, TRACE_AT1, TRACE_AT2, TRACE_AT3, TRACE_AT4, TRACE_AT5, TRACE_AT6, TRACE_AT7,
];

/// For kernels without attach cookies: memleak's entry program for each
/// allocator shape (the cookie `ML_ALLOC_ENTER` reads elsewhere).
pub const ML_ENTER_BY_SHAPE: &[(u64, Prog)] = {
    use crate::memleak::shape;
    &[
        (shape::SIZE, ML_ENTER_SIZE),
        (shape::CALLOC, ML_ENTER_CALLOC),
        (shape::REALLOC, ML_ENTER_REALLOC),
        (shape::REALLOCARRAY, ML_ENTER_REALLOCARRAY),
        (shape::ALIGNED, ML_ENTER_ALIGNED),
        (shape::POSIX_MEMALIGN, ML_ENTER_POSIX_MEMALIGN),
        (shape::PVALLOC, ML_ENTER_PVALLOC),
    ]
};
