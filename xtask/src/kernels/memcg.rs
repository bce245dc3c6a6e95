//! `memtrace memcg` in the guest: the warning before the OOM kill (usage
//! line, v1 or v2), the PSI pressure warning and its `--fail` (v2 only),
//! and the group's memory.events counts.

use serde_json::Value;

use super::check::{of_type, Case, Guest};

pub(super) fn check(g: &Guest, case: &Case, v: &[Value], wpid: i64, why: &mut Vec<String>) {
    unwinds_in_kernel(g, case, why);
    match case.name {
        "warn-fail" => warn_fail(g.info.contains("cgroup=v1"), v, why),
        "psi" => psi(v, wpid, why),
        "psi-fail" => psi_fail(v, wpid, why),
        "heap" => heap(g, v, wpid, why),
        _ => usage_line(v, wpid, why),
    }
}

/// memcg's OOM probe takes no stacks (memcg never shows them) and builds
/// its record off the stack, so memcg keeps unwinding in the kernel on 6.1
/// and 6.12. Before, both refused the OOM probe with the unwinder in it
/// ("combined stack size ... too large"), and memcg fell back to frame
/// pointers after some 40 s of refusals under emulation. 5.10 has no
/// in-kernel unwinder (the compat object).
fn unwinds_in_kernel(g: &Guest, case: &Case, why: &mut Vec<String>) {
    // arm64: the unwinder program walks x86-64's registers only.
    if case.name != "memcg" || g.arm64() || g.kernel().is_none_or(|k| k < (6, 1)) {
        return;
    }
    let refused = g.err.get(case.name).is_some_and(|e| {
        e.iter()
            .any(|l| l.contains("in-kernel unwinding could not be set up"))
    });
    if refused {
        why.push("memcg fell back from unwinding in the kernel".into());
    }
}

/// `--heap`: the kill's report of what the victim held names the function
/// that grew it 1 MiB at a time, with about the 64 MiB limit (an estimate
/// from samples: 40 to 90 MiB). On arm64 the process gets uprobes, which
/// go on some time after it appears (over a second under emulation), so
/// the first of its blocks may be missed (said in the README): 20 or more.
fn heap(g: &Guest, v: &[Value], wpid: i64, why: &mut Vec<String>) {
    let held: u64 = of_type(v, "memcg_oom_heap")
        .into_iter()
        .filter(|r| r["pid"] == wpid)
        .filter(|r| {
            r["user_stack"].as_array().is_some_and(|f| {
                f.iter()
                    .any(|f| f.as_str().is_some_and(|f| f.contains("grow_heap_mib")))
            })
        })
        .map(|r| r["bytes"].as_u64().unwrap_or(0))
        .sum();
    let mib = held >> 20;
    let floor = if g.arm64() { 20 } else { 40 };
    if !(floor..=90).contains(&mib) {
        why.push(format!(
            "memcg_oom_heap: {mib} MiB held through grow_heap_mib by {wpid}, expected {floor}-90"
        ));
    }
    // The run-up from events, though the group filled in about 0.7 s: a
    // point at each tenth of the limit (v1: the kernel's notifier; v2: the
    // usage read at allocations).
    let steps: std::collections::BTreeSet<&str> = of_type(v, "memcg_oom_timeline")
        .into_iter()
        .filter_map(|t| t["by"].as_str().filter(|b| b.starts_with("crossed")))
        .collect();
    if steps.len() < 5 {
        why.push(format!("run-up steps {steps:?}: expected 5 tenths or more"));
    }
}

/// The one warning, with `fields` as expected and the workload first
/// among the processes that grew most.
fn warning<'a>(
    v: &'a [Value],
    wpid: i64,
    fields: &[(&str, Value)],
    why: &mut Vec<String>,
) -> Option<&'a Value> {
    let warns = of_type(v, "memcg_warn");
    if warns.len() != 1 {
        why.push(format!("{} warnings, expected 1", warns.len()));
    }
    let w = *warns.first()?;
    for (field, want) in fields {
        if w[*field] != *want {
            why.push(format!("memcg_warn {field} {} != {want}", w[*field]));
        }
    }
    let first = w["pids"].as_str().and_then(|p| p.split(',').next());
    if first != Some(wpid.to_string().as_str()) {
        why.push(format!(
            "memcg_warn pids {} do not start with {wpid}",
            w["pids"]
        ));
    }
    Some(w)
}

/// The warning comes before the kill of the workload, which carries its
/// timeline.
fn warned_then_killed(v: &[Value], wpid: i64, why: &mut Vec<String>) {
    let pos = |ty: &str| v.iter().position(|x| x["type"] == ty);
    let (warn, oom) = (pos("memcg_warn"), pos("memcg_oom"));
    if warn.is_none() || oom.is_none() || warn > oom {
        why.push(format!("warning at {warn:?}, kill at {oom:?}"));
    }
    if !of_type(v, "memcg_oom")
        .iter()
        .any(|k| k["victim_pid"] == wpid)
    {
        why.push(format!("no memcg_oom of {wpid}"));
    }
    if of_type(v, "memcg_oom_timeline").is_empty() {
        why.push("no timeline".into());
    }
}

/// The last table row's memory.events count `field` since start.
fn events(v: &[Value], field: &str) -> Option<u64> {
    of_type(v, "memcg_sample").last()?[field].as_u64()
}

/// The warning at 75% of the parent's 64 MiB before the kill, naming the
/// workload; the kill with its timeline.
fn usage_line(v: &[Value], wpid: i64, why: &mut Vec<String>) {
    warned_then_killed(v, wpid, why);
    warning(
        v,
        wpid,
        &[
            ("cgroup", "/mt-memcg/kid".into()),
            ("limit_at", "/mt-memcg".into()),
            ("limit_kb", (64 * 1024).into()),
        ],
        why,
    );
    if events(v, "oom_kill") != Some(1) {
        why.push(format!(
            "oom_kill {:?} in the last row, expected 1",
            events(v, "oom_kill")
        ));
    }
}

/// Throttled over memory.high (120 MiB), then killed at memory.max (128
/// MiB): the pressure warning first, naming the workload; memory.events
/// counted every step of it.
fn psi(v: &[Value], wpid: i64, why: &mut Vec<String>) {
    warned_then_killed(v, wpid, why);
    warning(
        v,
        wpid,
        &[
            ("cgroup", "/mt-psi".into()),
            ("trigger", "pressure".into()),
            ("limit_at", "/mt-psi".into()),
            ("limit_kb", (128 * 1024).into()),
        ],
        why,
    );
    // high: throttled; max: a charge hit memory.max; then the OOM and its kill.
    for (field, least, most) in [
        ("high", 1, u64::MAX),
        ("max", 1, u64::MAX),
        ("oom", 1, u64::MAX),
        ("oom_kill", 1, 1),
    ] {
        match events(v, field) {
            Some(n) if (least..=most).contains(&n) => {}
            n => why.push(format!("memory.events {field} {n:?} in the last row")),
        }
    }
}

/// `--fail`: memtrace ended by itself after the one pressure warning, with
/// the workload still throttled, never killed.
fn psi_fail(v: &[Value], wpid: i64, why: &mut Vec<String>) {
    warning(
        v,
        wpid,
        &[
            ("cgroup", "/mt-psi-fail".into()),
            ("trigger", "pressure".into()),
        ],
        why,
    );
    if !of_type(v, "memcg_oom").is_empty() {
        why.push("an OOM kill in a group with no memory.max in reach".into());
    }
    match events(v, "high") {
        Some(n) if n > 0 => {}
        n => why.push(format!("memory.events high {n:?} in the last row")),
    }
}

/// `--warn 50 --fail` on page cache (no RSS change): warned by the v1
/// notifier, or on v2 by memory.events (high) or a sample, never at an
/// allocation; usage over 64 MiB; memtrace ended by itself.
fn warn_fail(v1: bool, v: &[Value], why: &mut Vec<String>) {
    let warns = of_type(v, "memcg_warn");
    if warns.len() != 1 {
        why.push(format!("{} warnings, expected 1", warns.len()));
    }
    let Some(w) = warns.first() else { return };
    let by = w["trigger"].as_str().unwrap_or("-");
    let ok = if v1 {
        by == "threshold"
    } else {
        matches!(by, "memory.events" | "sample")
    };
    if !ok {
        why.push(format!("warned by {by}"));
    }
    if w["cgroup"] != "/mt-warn-fail" || w["limit_kb"] != 128 * 1024 {
        why.push(format!("memcg_warn {w}"));
    }
    if w["usage_kb"].as_u64().unwrap_or(0) < 64 * 1024 {
        why.push(format!("warned at {} kB, under the line", w["usage_kb"]));
    }
    // What woke memtrace up is in the table too.
    if by == "memory.events" && events(v, "high").unwrap_or(0) == 0 {
        why.push(format!(
            "memory.events high {:?} in the last row",
            events(v, "high")
        ));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_guest_kernel_version_is_read_from_its_info_line() {
        let k = |info: &str| {
            super::super::check::Guest {
                info: info.into(),
                ..Default::default()
            }
            .kernel()
        };
        assert_eq!(
            k("kernel=6.12.117+deb12-amd64 cgroup=v2 cpus=2"),
            Some((6, 12))
        );
        assert_eq!(k("kernel=6.1.0-48-amd64 cgroup=v1"), Some((6, 1)));
        assert_eq!(k("kernel=5.10.0-46-amd64"), Some((5, 10)));
        assert_eq!(k("cgroup=v1"), None);
    }

    #[test]
    fn a_memcg_that_fell_back_from_unwinding_in_the_kernel_fails() {
        let case = crate::kernels::check::case("memcg", "memcg");
        let log = |kernel: &str| {
            format!(
                "MT-INFO kernel={kernel} cgroup=v2\n\
                 MT-ERR memcg memtrace: in-kernel unwinding could not be set up: cannot trace oom kill\n"
            )
        };
        let check = |kernel: &str| {
            let mut why = Vec::new();
            let g = crate::kernels::check::parse(&log(kernel));
            super::unwinds_in_kernel(&g, &case, &mut why);
            why.len()
        };
        assert_eq!(check("6.12.117"), 1);
        assert_eq!(check("6.1.0"), 1);
        // No in-kernel unwinder there (the compat object): not checked.
        assert_eq!(check("5.10.0"), 0);
    }
}
