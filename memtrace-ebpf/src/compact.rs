//! `compactsnoop`: each compaction run timed from `mm_compaction_begin` to
//! `mm_compaction_end` on its thread, with the order `mm_compaction_suitable`
//! said just before it (none for a write to compact_memory, which compacts
//! for every order and skips that check).

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::{HashMap, LruHashMap},
    programs::TracePointContext,
    Global,
};
use memtrace_common::{
    compact::{CompactConfig, CompactEvent, CompactStart},
    kind, loss, TASK_COMM_LEN,
};

use crate::helpers::{count_loss, current_tgid, emit, tp_field, wanted};

#[unsafe(no_mangle)]
static COMPACT_CFG: Global<CompactConfig> = Global::new(CompactConfig {
    min_latency_ns: 0,
    tp_begin_zone: 0,
    tp_begin_sync: 0,
    tp_end_status: 0,
    tp_suitable_order: 0,
});

#[map]
static COMPACT_START: HashMap<u32, CompactStart> = HashMap::with_max_entries(4096, 0);

/// The order of the last suitability check, by thread: least recently used
/// go first, as checks also come from the allocator's retry logic with no
/// run after them.
#[map]
static COMPACT_ORDER: LruHashMap<u32, i32> = LruHashMap::with_max_entries(4096, 0);

#[inline(always)]
fn tid() -> u32 {
    bpf_get_current_pid_tgid() as u32
}

#[tracepoint]
pub fn compact_suitable(ctx: TracePointContext) -> u32 {
    if !wanted(current_tgid()) {
        return 0;
    }
    let order: i32 = tp_field(&ctx, COMPACT_CFG.load().tp_suitable_order);
    let _ = COMPACT_ORDER.insert(&tid(), &order, 0);
    0
}

#[tracepoint]
pub fn compact_begin(ctx: TracePointContext) -> u32 {
    if !wanted(current_tgid()) {
        return 0;
    }
    let cfg = COMPACT_CFG.load();
    let id = tid();
    // A check just before this run gave its order; a run with none before
    // it compacts for every order.
    let order = match unsafe { COMPACT_ORDER.get(&id) } {
        Some(o) => {
            let o = *o;
            let _ = COMPACT_ORDER.remove(&id);
            o
        }
        None => -1,
    };
    let sync: u8 = tp_field(&ctx, cfg.tp_begin_sync);
    let start = CompactStart {
        ts: unsafe { bpf_ktime_get_ns() },
        zone_start: tp_field(&ctx, cfg.tp_begin_zone),
        order,
        sync: sync as u32,
    };
    if COMPACT_START.insert(&id, &start, 0).is_err() {
        count_loss(loss::MAP_FULL);
    }
    0
}

#[tracepoint]
pub fn compact_end(ctx: TracePointContext) -> u32 {
    let id = tid();
    let Some(start) = (unsafe { COMPACT_START.get(&id) }).copied() else {
        return 0;
    };
    let _ = COMPACT_START.remove(&id);
    let cfg = COMPACT_CFG.load();
    let lat = unsafe { bpf_ktime_get_ns() }.saturating_sub(start.ts);
    if lat < cfg.min_latency_ns {
        return 0;
    }
    emit(&CompactEvent {
        kind: kind::COMPACT,
        pid: current_tgid(),
        tid: id,
        status: tp_field(&ctx, cfg.tp_end_status),
        order: start.order,
        sync: start.sync,
        zone_start: start.zone_start,
        lat_ns: lat,
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
    });
    0
}
