//! `compactsnoop`: memory compaction runs, each from its begin to its end
//! tracepoint, by the task that ran it (a direct compaction stalls an
//! allocation; a write to /proc/sys/vm/compact_memory compacts every zone).

use crate::TASK_COMM_LEN;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CompactConfig {
    /// Minimum run (ns) to send a record.
    pub min_latency_ns: u64,
    /// Offsets in `mm_compaction_begin`: `zone_start`, `sync`.
    pub tp_begin_zone: u32,
    pub tp_begin_sync: u32,
    /// Offset of `status` in `mm_compaction_end`.
    pub tp_end_status: u32,
    /// Offset of `order` in `mm_compaction_suitable`.
    pub tp_suitable_order: u32,
}

/// A run in progress, by thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CompactStart {
    pub ts: u64,
    pub zone_start: u64,
    /// The allocation order the run compacts for; -1 for every order (a
    /// write to compact_memory).
    pub order: i32,
    pub sync: u32,
}

/// One compaction run (`kind::COMPACT`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CompactEvent {
    pub kind: u32,
    pub pid: u32,
    pub tid: u32,
    /// The kernel's `enum compact_result`; its names come from the end
    /// tracepoint's format.
    pub status: i32,
    pub order: i32,
    pub sync: u32,
    /// The compacted zone's first page frame (`/proc/zoneinfo`'s start_pfn).
    pub zone_start: u64,
    pub lat_ns: u64,
    pub comm: [u8; TASK_COMM_LEN],
}

crate::names! {
    maps {
        COMPACT_START: u32 => CompactStart, OnDemand;
        COMPACT_ORDER: u32 => i32, OnDemand;
    }
    globals {
        COMPACT_CFG: CompactConfig;
    }
    progs {
        COMPACT_BEGIN = compact_begin,
        COMPACT_END = compact_end,
        COMPACT_SUITABLE = compact_suitable,
    }
}

crate::pod!(CompactConfig, CompactStart, CompactEvent);
