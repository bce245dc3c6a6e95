//! Copied stacks (`--stack-mode dwarf` with the copy unwinder) as reports:
//! those of exited processes resolved to rows as they exit, the rest at
//! the report.

use memtrace_common::stack_mode;

use super::{group_of, placed_once_gone, FOLDED};
use crate::output::StackReport;
use crate::stacks::unwind::{SampleKey, SampleVal};
use crate::stacks::Traced;

/// A copied stack's count as a report, scaled by the sampling rate
/// (estimates when sampled), with its summed value as bytes.
fn sample_report(
    s: &mut Traced,
    every: u64,
    mode: u32,
    k: &SampleKey,
    val: &SampleVal,
) -> StackReport {
    // brkstack's final report held 515,000 unplaced frames (41 MB).
    let user = match k.folded {
        true => vec![FOLDED.into()],
        false => placed_once_gone(k.tgid, s.sym.user(k.tgid, &k.user)),
    };
    let kernel = s.kernel_frames(k.kstack);
    let note = if mode & stack_mode::KERNEL != 0 && k.kstack < 0 && !k.folded {
        Some("kernel stack capture failed (counted in stack_fail)".to_string())
    } else {
        val.end.and_then(|e| e.note()).map(String::from)
    };
    StackReport {
        pid: k.tgid,
        comm: val.comm.clone(),
        count: val.count * every,
        bytes: Some(val.value * every),
        user,
        kernel,
        note,
        processes: 1,
        alloc: None,
        pids: Vec::new(),
        group: group_of(s, k.tgid),
    }
}

/// In dwarf mode, the unwound samples as stack reports: those of exited
/// processes already resolved, then the rest, largest first; None in fp
/// mode.
pub fn sampled_reports(
    s: &mut Traced,
    clear: bool,
    top: usize,
    with_value: bool,
) -> Option<impl Iterator<Item = StackReport> + '_> {
    let d = s.dwarf.as_mut()?;
    let (every, mode) = (d.every as u64, d.mode);
    let resolved = d.samples.resolved_reports(clear);
    let mut v = d.take(clear);
    v.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(b.1.value.cmp(&a.1.value)));
    v.truncate(top);
    // Made as they are taken: a churn's final report held every one at
    // once before merging (brkstack at 165 MiB beside the soak's churn).
    let live = v
        .into_iter()
        .map(move |(k, val)| sample_report(s, every, mode, &k, &val));
    Some(resolved.into_iter().chain(live).map(move |mut r| {
        if !with_value {
            r.bytes = None;
        }
        r
    }))
}

/// Resolves the copied stacks of exited processes to rows, and lets go of
/// what the unwinder kept for them. Kept as addresses until the report,
/// they were most of brkstack's memory under a churn (a 75 MiB peak).
pub fn resolve_exited_samples(s: &mut Traced) {
    // Taken out while the stacks are symbolized through the session.
    let Some(mut d) = s.dwarf.take() else {
        return;
    };
    let (every, mode) = (d.every as u64, d.mode);
    let alive = crate::process::proc::alive;
    d.samples.resolve_exited(alive, |k, v| {
        crate::stacks::kept::resolved(sample_report(s, every, mode, k, v))
    });
    d.samples.forget_maps(&s.sym.maps);
    d.forget_exited(alive);
    s.dwarf = Some(d);
}

/// A title note for sampled stacks, empty when every event was unwound.
pub fn sampled_title(s: &Traced) -> String {
    match &s.dwarf {
        Some(d) if d.every > 1 => format!("stacks sampled 1 in {}: counts are estimates", d.every),
        _ => String::new(),
    }
}
