//! Reclaim as vmscan and drsnoop see it: the begin/end tracepoint pairs,
//! their configuration, and the totals the kernel programs keep.

use memtrace_common::names::{
    DIRECT_RECLAIM_BEGIN, MEMCG_RECLAIM_BEGIN, PROC_RECLAIM, RECLAIM_CFG, RECLAIM_END,
    RECLAIM_START, RECLAIM_TOTALS, SLAB_START,
};
use memtrace_common::reclaim::{total, ReclaimConfig};

use crate::error::Result;
use crate::session::attach::Probe;
use crate::session::Prep;
use crate::stacks::Traced;

/// Reclaim begin/end pairs.
pub fn reclaim_probes() -> Vec<Probe> {
    vec![
        Probe::new("direct reclaim begin").tracepoint(
            DIRECT_RECLAIM_BEGIN,
            "vmscan",
            "mm_vmscan_direct_reclaim_begin",
        ),
        Probe::new("direct reclaim end").tracepoint(
            RECLAIM_END,
            "vmscan",
            "mm_vmscan_direct_reclaim_end",
        ),
        Probe::new("memcg reclaim begin")
            .tracepoint(
                MEMCG_RECLAIM_BEGIN,
                "vmscan",
                "mm_vmscan_memcg_reclaim_begin",
            )
            .optional(),
        Probe::new("memcg reclaim end")
            .tracepoint(RECLAIM_END, "vmscan", "mm_vmscan_memcg_reclaim_end")
            .optional(),
    ]
}

/// Sets RECLAIM_CFG and sizes the maps the pairs use.
pub fn prepare_reclaim(k: &mut Prep, cfg: ReclaimConfig) -> Result<()> {
    let f = k.format("vmscan", "mm_vmscan_direct_reclaim_end")?;
    let cfg = ReclaimConfig {
        tp_nr_reclaimed: f.offset("nr_reclaimed")?,
        ..cfg
    };
    k.loader.global(RECLAIM_CFG, &cfg);
    k.loader.max_entries(RECLAIM_START, 4096);
    k.loader.max_entries(SLAB_START, 4096);
    if cfg.per_process != 0 {
        k.loader.max_entries(PROC_RECLAIM, 4096);
    }
    Ok(())
}

/// The reclaim totals, summed over CPUs.
pub fn read_totals(s: &Traced) -> Result<[u64; total::NR]> {
    let mut sum = [0u64; total::NR];
    for vals in s.read_percpu_array(RECLAIM_TOTALS)? {
        for v in vals {
            for (i, x) in v.v.iter().enumerate() {
                sum[i] += x;
            }
        }
    }
    Ok(sum)
}
