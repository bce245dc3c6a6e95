//! `swapin`: swap-ins by process. Only kprobe or fentry on `swap_read_folio`
//! (`swap_readpage` before 6.x) see them; there is no tracepoint.

use aya_ebpf::{
    helpers::bpf_get_current_comm,
    macros::{fentry, kprobe, map},
    maps::PerCpuHashMap,
    programs::{FEntryContext, ProbeContext},
};
use memtrace_common::{faults::FaultVal, loss, ProcKey, TASK_COMM_LEN};

use crate::helpers::{count_gen, count_loss, current_tgid, wanted, NO_PREALLOC};

#[map]
static SWAPINS: PerCpuHashMap<ProcKey, FaultVal> =
    PerCpuHashMap::with_max_entries(8192, NO_PREALLOC);

#[inline(always)]
fn count() {
    let tgid = current_tgid();
    if !wanted(tgid) {
        return;
    }
    let key = ProcKey {
        tgid,
        gen: count_gen(),
    };
    if let Some(v) = SWAPINS.get_ptr_mut(&key) {
        unsafe { (*v).count += 1 };
        return;
    }
    let v = FaultVal {
        count: 1,
        memcg_id: 0,
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
        last: 0,
        _pad: 0,
    };
    if SWAPINS.insert(&key, &v, 0).is_err() {
        count_loss(loss::MAP_FULL);
    }
}

#[kprobe]
pub fn swapin_kprobe(_ctx: ProbeContext) -> u32 {
    count();
    0
}

#[fentry(function = "swap_read_folio")]
pub fn swapin_fentry(_ctx: FEntryContext) -> i32 {
    count();
    0
}
