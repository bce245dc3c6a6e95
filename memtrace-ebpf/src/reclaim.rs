//! `vmscan` and `drsnoop`: reclaim time measured from the vmscan begin/end
//! tracepoint pairs, per CPU totals for the dashboard, per-process totals and
//! one record per stall for drsnoop.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::{HashMap, PerCpuArray, PerCpuHashMap},
    programs::TracePointContext,
    Global,
};
use memtrace_common::{
    kind, loss,
    reclaim::{
        total, ProcReclaimKey, ProcReclaimVal, ReclaimConfig, ReclaimEvent, ReclaimTotals,
        KIND_DIRECT, KIND_MEMCG,
    },
    TASK_COMM_LEN,
};

use crate::helpers::{
    count_gen, count_loss, current_task, current_tgid, emit, memcg_id, tp_field, wanted,
    NO_PREALLOC,
};

#[unsafe(no_mangle)]
static RECLAIM_CFG: Global<ReclaimConfig> = Global::new(ReclaimConfig {
    emit_events: 0,
    per_process: 0,
    min_latency_ns: 0,
    tp_nr_reclaimed: 0,
    per_memcg: 0,
});

/// Start of the reclaim in progress, by thread: [ts, kind].
#[map]
static RECLAIM_START: HashMap<u32, [u64; 2]> = HashMap::with_max_entries(4096, 0);

#[map]
static SLAB_START: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

#[map]
static RECLAIM_TOTALS: PerCpuArray<ReclaimTotals> = PerCpuArray::with_max_entries(1, 0);

#[map]
static PROC_RECLAIM: PerCpuHashMap<ProcReclaimKey, ProcReclaimVal> =
    PerCpuHashMap::with_max_entries(4096, NO_PREALLOC);

/// Stall time by the memory cgroup (kernfs id) of the task that stalled:
/// the reclaim tracepoints do not say which group is being reclaimed.
#[map]
static MEMCG_RECLAIM: PerCpuHashMap<u64, ProcReclaimVal> =
    PerCpuHashMap::with_max_entries(1024, NO_PREALLOC);

#[inline(always)]
fn tid() -> u32 {
    bpf_get_current_pid_tgid() as u32
}

#[inline(always)]
fn add(i: usize, v: u64) {
    if let Some(t) = RECLAIM_TOTALS.get_ptr_mut(0) {
        if i < total::NR {
            unsafe { (*t).v[i] += v };
        }
    }
}

#[inline(always)]
fn begin(kind: u32) -> u32 {
    if !wanted(current_tgid()) {
        return 0;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    if RECLAIM_START.insert(tid(), [now, kind as u64], 0).is_err() {
        count_loss(loss::MAP_FULL);
    }
    0
}

#[tracepoint]
pub fn direct_reclaim_begin(_ctx: TracePointContext) -> u32 {
    begin(KIND_DIRECT)
}

#[tracepoint]
pub fn memcg_reclaim_begin(_ctx: TracePointContext) -> u32 {
    begin(KIND_MEMCG)
}

/// Both `*_reclaim_end` tracepoints: `unsigned long nr_reclaimed`.
#[tracepoint]
pub fn reclaim_end(ctx: TracePointContext) -> u32 {
    let id = tid();
    let Some(start) = (unsafe { RECLAIM_START.get(id) }).copied() else {
        return 0;
    };
    let _ = RECLAIM_START.remove(id);
    let cfg = RECLAIM_CFG.load();
    let lat = unsafe { bpf_ktime_get_ns() }.saturating_sub(start[0]);
    let pages: u64 = tp_field(&ctx, cfg.tp_nr_reclaimed);
    let kind_ = start[1] as u32;
    if kind_ == KIND_DIRECT {
        add(total::DIRECT_NS, lat);
        add(total::DIRECT_PAGES, pages);
        add(total::DIRECT_STALLS, 1);
    } else {
        add(total::MEMCG_NS, lat);
        add(total::MEMCG_PAGES, pages);
        add(total::MEMCG_STALLS, 1);
    }
    let tgid = current_tgid();
    if cfg.per_process != 0 {
        let key = ProcReclaimKey {
            tgid,
            kind: kind_,
            gen: count_gen(),
        };
        add_stall(&PROC_RECLAIM, &key, lat, pages);
    }
    if cfg.per_memcg != 0 {
        let id = unsafe { memcg_id(current_task()) };
        add_stall(&MEMCG_RECLAIM, &id, lat, pages);
    }
    if cfg.emit_events != 0 && lat >= cfg.min_latency_ns {
        let memcg = if kind_ == KIND_MEMCG {
            unsafe { memcg_id(current_task()) }
        } else {
            0
        };
        emit(&ReclaimEvent {
            kind: kind::RECLAIM,
            reclaim: if kind_ == KIND_DIRECT {
                KIND_DIRECT
            } else {
                KIND_MEMCG
            },
            pid: tgid,
            tid: id,
            lat_ns: lat,
            pages,
            memcg_id: memcg,
            comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
        });
    }
    0
}

#[tracepoint]
pub fn shrink_slab_start(_ctx: TracePointContext) -> u32 {
    let now = unsafe { bpf_ktime_get_ns() };
    if SLAB_START.insert(tid(), now, 0).is_err() {
        count_loss(loss::MAP_FULL);
    }
    0
}

#[tracepoint]
pub fn shrink_slab_end(_ctx: TracePointContext) -> u32 {
    let id = tid();
    if let Some(start) = unsafe { SLAB_START.get(id) }.copied() {
        let _ = SLAB_START.remove(id);
        add(
            total::SLAB_NS,
            unsafe { bpf_ktime_get_ns() }.saturating_sub(start),
        );
    }
    0
}

#[tracepoint]
pub fn kswapd_wake(_ctx: TracePointContext) -> u32 {
    add(total::KSWAPD_WAKE, 1);
    0
}

#[tracepoint]
pub fn reclaim_write(_ctx: TracePointContext) -> u32 {
    add(total::WRITEPAGE, 1);
    0
}

/// One stall of `lat` ns that reclaimed `pages`, added to `key`'s entry.
#[inline(always)]
fn add_stall<K>(map: &PerCpuHashMap<K, ProcReclaimVal>, key: &K, lat: u64, pages: u64) {
    if let Some(v) = map.get_ptr_mut(key) {
        unsafe {
            (*v).ns += lat;
            (*v).stalls += 1;
            (*v).pages += pages;
        }
        return;
    }
    let v = ProcReclaimVal {
        ns: lat,
        stalls: 1,
        pages,
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
    };
    if map.insert(key, &v, 0).is_err() {
        count_loss(loss::MAP_FULL);
    }
}
