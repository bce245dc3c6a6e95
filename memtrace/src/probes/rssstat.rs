//! kmem:rss_stat as the kernel programs read it: the field offsets and the
//! kernel's mm counter indexes, shared by the tools that follow RSS changes.

use memtrace_common::rss::{RssConfig, RssExitConfig, ANON, FILE, NR, SHMEM, SWAP};

use crate::error::Result;
use crate::session::Prep;

/// The tracepoint's offsets and counter slots, with `threshold` (0: none).
pub fn config(k: &Prep, threshold: u64) -> Result<RssConfig> {
    let f = k.format("kmem", "rss_stat")?;
    // The kernel's mm counter indexes, by name: their order is not ABI.
    let mut r = k.btf()?.resolver();
    let mut slots = [NR as u8; 8];
    for (name, slot) in [
        ("MM_FILEPAGES", FILE),
        ("MM_ANONPAGES", ANON),
        ("MM_SWAPENTS", SWAP),
        ("MM_SHMEMPAGES", SHMEM),
    ] {
        let i = r.enumerator("", name) as usize;
        if let Some(s) = slots.get_mut(i) {
            *s = slot as u8;
        }
    }
    let slots = r.done("the mm counters of kmem:rss_stat", slots)?;
    Ok(RssConfig {
        tp_mm_id: f.offset("mm_id")?,
        tp_curr: f.offset("curr")?,
        tp_member: f.offset("member")?,
        tp_size: f.offset("size")?,
        threshold,
        slots,
    })
}

/// What tells a process's last thread leaving at sched:sched_process_exit.
pub fn exit_config(k: &Prep) -> Result<RssExitConfig> {
    let exit = k.format("sched", "sched_process_exit")?;
    let mut r = k.btf()?.resolver();
    let live = (
        r.member("task_struct", "signal"),
        r.member("signal_struct", "live"),
    );
    let (task_signal, signal_live) = r.done("a process's live threads", live)?;
    Ok(RssExitConfig {
        // Absent before 6.16: `signal->live` then.
        tp_group_dead: exit.offset("group_dead").unwrap_or(0),
        task_signal,
        signal_live,
        _pad: 0,
    })
}
