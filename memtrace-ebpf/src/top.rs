//! `top` and `serve`: mmap calls and the bytes they ask for, counted per
//! process and CPU at sys_enter_mmap (one record per call through the ring
//! buffer, as mmapsnoop sends, would cost a consumer on every host).

use aya_ebpf::{
    helpers::bpf_get_current_comm,
    macros::{map, tracepoint},
    maps::PerCpuHashMap,
    programs::TracePointContext,
    Global,
};
use memtrace_common::{
    loss,
    top::{MmapCount, TopConfig},
    ProcKey, TASK_COMM_LEN,
};

use crate::helpers::{count_gen, count_loss, current_tgid, tp_field, wanted, NO_PREALLOC};

#[unsafe(no_mangle)]
static TOP_CFG: Global<TopConfig> = Global::new(TopConfig {
    tp_mmap_len: 0,
    _pad: 0,
});

/// Counted by generation (`count_gen`): userspace takes an ended one.
#[map]
static MMAP_COUNTS: PerCpuHashMap<ProcKey, MmapCount> =
    PerCpuHashMap::with_max_entries(4096, NO_PREALLOC);

#[tracepoint]
pub fn top_mmap(ctx: TracePointContext) -> u32 {
    let tgid = current_tgid();
    if !wanted(tgid) {
        return 0;
    }
    let len: u64 = tp_field(&ctx, TOP_CFG.load().tp_mmap_len);
    // Per-CPU values: no other CPU writes this slot, so plain adds are exact.
    let key = ProcKey {
        tgid,
        gen: count_gen(),
    };
    if let Some(v) = MMAP_COUNTS.get_ptr_mut(&key) {
        unsafe {
            (*v).calls += 1;
            (*v).bytes += len;
        }
        return 0;
    }
    let v = MmapCount {
        calls: 1,
        bytes: len,
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
    };
    if MMAP_COUNTS.insert(&key, &v, 0).is_err() {
        count_loss(loss::MAP_FULL);
    }
    0
}
