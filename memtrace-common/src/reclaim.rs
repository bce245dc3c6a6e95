//! `vmscan` and `drsnoop`: reclaim activity from the vmscan tracepoints.

use crate::TASK_COMM_LEN;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ReclaimConfig {
    /// Send one record per direct/memcg reclaim stall (drsnoop).
    pub emit_events: u32,
    /// Aggregate stall time per process (vmscan --per-process).
    pub per_process: u32,
    /// Minimum stall (ns) to emit a record.
    pub min_latency_ns: u64,
    /// `nr_reclaimed` offset in `mm_vmscan_*_reclaim_end`.
    pub tp_nr_reclaimed: u32,
    /// Aggregate stall time per memory cgroup of the stalled task (memcg).
    pub per_memcg: u32,
}

/// Index into the per-CPU `RECLAIM_TOTALS` array counters.
pub mod total {
    pub const SLAB_NS: usize = 0;
    pub const DIRECT_NS: usize = 1;
    pub const MEMCG_NS: usize = 2;
    pub const KSWAPD_WAKE: usize = 3;
    pub const WRITEPAGE: usize = 4;
    pub const DIRECT_PAGES: usize = 5;
    pub const MEMCG_PAGES: usize = 6;
    pub const DIRECT_STALLS: usize = 7;
    pub const MEMCG_STALLS: usize = 8;
    pub const NR: usize = 9;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ReclaimTotals {
    pub v: [u64; total::NR],
}

pub const KIND_DIRECT: u32 = 1;
pub const KIND_MEMCG: u32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ProcReclaimKey {
    pub tgid: u32,
    pub kind: u32,
    /// The count generation (see `Generational`).
    pub gen: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcReclaimVal {
    pub ns: u64,
    pub stalls: u64,
    pub pages: u64,
    pub comm: [u8; TASK_COMM_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ReclaimEvent {
    pub kind: u32,
    /// `KIND_DIRECT` or `KIND_MEMCG`.
    pub reclaim: u32,
    pub pid: u32,
    pub tid: u32,
    pub lat_ns: u64,
    pub pages: u64,
    pub memcg_id: u64,
    pub comm: [u8; TASK_COMM_LEN],
}

crate::names! {
    maps {
        RECLAIM_START: u32 => [u64; 2], OnDemand;
        SLAB_START: u32 => u64, OnDemand;
        RECLAIM_TOTALS: u32 => ReclaimTotals, Compiled;
        PROC_RECLAIM: ProcReclaimKey => ProcReclaimVal, OnDemand;
        MEMCG_RECLAIM: u64 => ProcReclaimVal, OnDemand;
    }
    globals {
        RECLAIM_CFG: ReclaimConfig;
    }
    progs {
        DIRECT_RECLAIM_BEGIN = direct_reclaim_begin,
        MEMCG_RECLAIM_BEGIN = memcg_reclaim_begin,
        RECLAIM_END = reclaim_end,
        SHRINK_SLAB_START = shrink_slab_start,
        SHRINK_SLAB_END = shrink_slab_end,
        KSWAPD_WAKE = kswapd_wake,
        RECLAIM_WRITE = reclaim_write,
    }
}

crate::pod!(
    ReclaimConfig,
    ReclaimTotals,
    ProcReclaimKey,
    ProcReclaimVal,
    ReclaimEvent
);
