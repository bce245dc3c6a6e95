//! OOM kills as the kernel programs report them: the ways in (best first)
//! and the offsets each needs, for every tool that reports kills.

use memtrace_common::names;
use memtrace_common::oom::{OomKprobeOffsets, OomTpOffsets};

use crate::error::Result;
use crate::session::attach::Probe;
use crate::session::Prep;

pub fn probes() -> Vec<Probe> {
    vec![Probe::new("oom kill")
        .kprobe(names::OOM_KPROBE, "oom_kill_process")
        .fentry(names::OOM_FENTRY, "oom_kill_process")
        // raw_tp before tp_btf: the same data, and it attaches without
        // parsing kernel BTF (tens of ms at start-up).
        .raw_tp(names::OOM_RAW_TP, "oom", "mark_victim")
        .tp_btf(names::OOM_TP_BTF, "oom", "mark_victim")
        .tracepoint(names::OOM_TRACEPOINT, "oom", "mark_victim")]
}

/// Sets the task offsets and each way's own offsets; a way whose offsets
/// are missing is ruled out with the reason (the others may still work).
/// The OOM probes' offsets; with `stacks`, the trigger's stacks are taken
/// too (as the tool's stack mode says).
pub fn prepare(k: &mut Prep, stacks: bool) -> Result<()> {
    k.loader.global(names::OOM_STACKS, &(stacks as u32));
    k.task_offsets()?;
    let mut r = k.btf()?.resolver();
    let oc = OomKprobeOffsets {
        totalpages: r.member("oom_control", "totalpages"),
        chosen: r.member("oom_control", "chosen"),
        memcg: r.member("oom_control", "memcg"),
        memcg_css: r.member("mem_cgroup", "css"),
    };
    match r.done("oom_kill_process's offsets", oc) {
        Ok(oc) => {
            k.loader.global(names::OOM_CONTROL, &oc);
        }
        Err(e) => {
            k.loader.rule_out(names::OOM_KPROBE, e.to_string());
            k.loader.rule_out(names::OOM_FENTRY, e.to_string());
        }
    }
    let tp = k.format("oom", "mark_victim").and_then(|f| {
        // The RSS fields came in 5.18; without them the victim's RSS is
        // read through its task (has_rss 0).
        let rss = |n| f.field(n).map_or(0, |x| x.offset);
        Ok(OomTpOffsets {
            pid: f.offset("pid")?,
            comm: f.offset("comm")?,
            total_vm: f.offset("total_vm")?,
            anon_rss: rss("anon_rss"),
            file_rss: rss("file_rss"),
            shmem_rss: rss("shmem_rss"),
            uid: f.offset("uid")?,
            oom_score_adj: f.offset("oom_score_adj")?,
            has_rss: f.field("anon_rss").is_some() as u32,
        })
    });
    match tp {
        Ok(tp) => {
            k.loader.global(names::OOM_TP, &tp);
        }
        Err(e) => {
            k.loader.rule_out(names::OOM_TRACEPOINT, e.to_string());
        }
    }
    Ok(())
}
