//! `memtrace doctor` in the guest: kprobes and fentry are there, and its
//! tool table shows every tool attachable, by the same methods, wherever
//! that tool's own cases pass (doctor loads each tool as the tool does).

use super::check::{attached_of, Case, Checked, Guest, Out, CASES};

/// One row of doctor's tool table.
#[derive(Debug)]
struct ToolRow {
    tool: String,
    probe: String,
    method: String,
    detail: String,
}

/// The rows under the `TOOL PROBE METHOD TARGET OR WHY NOT` header, cut at
/// the header's column starts (probe names hold spaces).
fn tool_rows(out: &[String]) -> Vec<ToolRow> {
    let Some(h) = out.iter().position(|l| l.starts_with("TOOL ")) else {
        return Vec::new();
    };
    let head = &out[h];
    let (Some(p), Some(m), Some(d)) =
        (head.find("PROBE"), head.find("METHOD"), head.find("TARGET"))
    else {
        return Vec::new();
    };
    let cut =
        |l: &str, a: usize, b: usize| l.get(a..b.min(l.len())).unwrap_or("").trim().to_string();
    out[h + 1..]
        .iter()
        .take_while(|l| !l.trim().is_empty())
        .map(|l| ToolRow {
            tool: cut(l, 0, p),
            probe: cut(l, p, m),
            // The first word: a long probe name may push it right.
            method: l
                .get(m..)
                .and_then(|r| r.split_whitespace().next())
                .unwrap_or("-")
                .to_string(),
            detail: cut(l, d, usize::MAX),
        })
        .collect()
}

pub(super) fn check(g: &Guest, case: &'static Case, done: &[Checked]) -> Checked {
    let mut why = Vec::new();
    let out = g.out.get(case.name).map_or(&[][..], |v| v);
    match g.cases.get(case.name).and_then(|st| st.get("rc")) {
        None => why.push("did not run".into()),
        Some(0) => {}
        Some(rc) => why.push(format!("doctor exited with {rc}")),
    }
    // FEATURE OK DETAIL rows.
    let ok = |feature: &str| {
        out.iter().any(|l| {
            l.strip_prefix(feature)
                .is_some_and(|r| r.starts_with(' ') && r.split_whitespace().next() == Some("yes"))
        })
    };
    let mut avail = Vec::new();
    for (f, short) in [("kprobe pmu", "kprobe"), ("fentry", "fentry")] {
        if ok(f) {
            avail.push(short);
        } else {
            why.push(format!("{f} not available"));
        }
    }
    let rows = tool_rows(out);
    // Report and diff read records: no tool of doctor's.
    let mut tools: Vec<&str> = CASES[1..]
        .iter()
        .filter(|c| c.out != Out::Replay)
        .map(|c| c.tool)
        .collect();
    tools.sort_unstable();
    tools.dedup();
    let mut shown = Vec::new();
    for tool in tools {
        let mine: Vec<&ToolRow> = rows.iter().filter(|r| r.tool == tool).collect();
        let cases: Vec<&Checked> = done.iter().filter(|c| c.case.tool == tool).collect();
        if cases.iter().any(|c| !c.why.is_empty()) {
            // Its own case fails here: doctor may rightly say it cannot attach.
            continue;
        }
        if mine.is_empty() {
            why.push(format!("no row for {tool}, whose cases pass"));
        }
        for r in &mine {
            if r.method == "-" && !r.detail.starts_with("optional") {
                why.push(format!("{tool} {} not attachable: {}", r.probe, r.detail));
            }
        }
        // Where a case ran with the default attach, doctor must pick the
        // same method for every probe both attached.
        for c in cases.iter().filter(|c| !c.case.forced) {
            for (probe, method) in attached_of(g, c.case) {
                if let Some(r) = mine.iter().find(|r| r.probe == probe && r.method != "-") {
                    if r.method != method {
                        why.push(format!(
                            "{tool} {probe}: doctor says {}, {} attached {method}",
                            r.method, c.case.name
                        ));
                    }
                }
            }
        }
        if matches!(tool, "oomkill" | "swapin") {
            if let Some(r) = mine.first() {
                shown.push(format!("{tool}: {}", r.method));
            }
        }
    }
    Checked {
        case,
        method: format!("{} ({})", avail.join("+"), shown.join(", ")),
        why,
        skip: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_rows_at_the_header_columns() {
        let out: Vec<String> = [
            "FEATURE                OK   DETAIL",
            "kprobe pmu             yes",
            "",
            "TOOL      PROBE                  METHOD     TARGET OR WHY NOT",
            "oomkill   oom kill               kprobe     oom_kill_process",
            "swapin    -                      -          no way: kprobe swap_read_folio: gone",
            "faults    process forks          -          optional: not attached here",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let rows = tool_rows(&out);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].probe, "oom kill");
        assert_eq!(rows[0].method, "kprobe");
        assert_eq!(rows[0].detail, "oom_kill_process");
        assert_eq!(rows[1].probe, "-");
        assert_eq!(rows[1].detail, "no way: kprobe swap_read_folio: gone");
        assert_eq!(rows[2].tool, "faults");
        assert!(rows[2].detail.starts_with("optional"));
    }
}
