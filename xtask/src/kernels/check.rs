//! What a guest printed: its `MT-` lines parsed by case, and the checks of
//! each case against what its workload did.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

/// What one guest printed, by case.
#[derive(Default)]
pub(super) struct Guest {
    pub info: String,
    pub out: BTreeMap<String, Vec<String>>,
    pub err: BTreeMap<String, Vec<String>>,
    pub cases: BTreeMap<String, BTreeMap<String, i64>>,
    pub end: Option<String>,
    pub console: String,
    pub wall: Duration,
}

pub(super) fn parse(console: &str) -> Guest {
    let mut g = Guest {
        console: console.to_string(),
        ..Default::default()
    };
    for line in console.lines() {
        let line = line.trim_end_matches('\r');
        let Some(i) = line.find("MT-") else { continue };
        let line = &line[i..];
        let (tag, rest) = line.split_once(' ').unwrap_or((line, ""));
        let (case, body) = rest.split_once(' ').unwrap_or((rest, ""));
        match tag {
            "MT-INFO" => g.info = rest.to_string(),
            "MT-OUT" => g.out.entry(case.into()).or_default().push(body.into()),
            "MT-ERR" => g.err.entry(case.into()).or_default().push(body.into()),
            "MT-CASE" => {
                let kv = body
                    .split_whitespace()
                    .filter_map(|f| f.split_once('='))
                    .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
                    .collect();
                g.cases.insert(case.into(), kv);
            }
            "MT-END" => g.end = Some(case.to_string()),
            _ => {}
        }
    }
    g
}

fn json(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

fn of_type<'a>(v: &'a [Value], ty: &str) -> Vec<&'a Value> {
    v.iter().filter(|x| x["type"] == ty).collect()
}

/// The attach method of the tool's main probe, from the JSON summary.
fn summary_method(v: &[Value], probe: &str) -> String {
    of_type(v, "summary")
        .first()
        .and_then(|s| s["attached"].as_array())
        .and_then(|a| a.iter().find(|p| p["probe"] == probe))
        .and_then(|p| p["method"].as_str())
        .unwrap_or("-")
        .to_string()
}

/// Checks one case's output; returns the method it used and what was wrong.
pub(super) fn check(g: &Guest, case: &str) -> (String, Vec<String>) {
    let mut why = Vec::new();
    let empty = Vec::new();
    let out = g.out.get(case).unwrap_or(&empty);
    let Some(st) = g.cases.get(case) else {
        return ("-".into(), vec!["did not run".into()]);
    };
    let rc = st.get("rc").copied().unwrap_or(-1);
    if rc != 0 {
        why.push(format!("memtrace exited with {rc}"));
    }
    let v = json(out);
    let probe = match case {
        "faults" => "user page faults",
        "brkstack" => "brk calls",
        "drsnoop" => "memcg reclaim end",
        _ => "oom kill",
    };
    let mut method = summary_method(&v, probe);
    match case {
        "doctor" => {
            // FEATURE OK DETAIL rows, and TOOL PROBE METHOD TARGET rows.
            let ok = |feature: &str| {
                out.iter().any(|l| {
                    l.strip_prefix(feature)
                        .is_some_and(|r| r.split_whitespace().next() == Some("yes"))
                })
            };
            for f in ["kprobe pmu", "fentry "] {
                if !ok(f) {
                    why.push(format!("doctor: {} not available", f.trim()));
                }
            }
            method = out
                .iter()
                .find(|l| l.starts_with("oomkill "))
                .and_then(|l| l.split_whitespace().nth(3))
                .unwrap_or("-")
                .to_string();
            let avail: Vec<&str> = ["kprobe pmu", "fentry "]
                .iter()
                .filter(|f| ok(f))
                .map(|f| f.split(' ').next().unwrap())
                .collect();
            if !avail.is_empty() {
                method = format!("{} (oomkill: {method})", avail.join("+"));
            }
        }
        c if c.starts_with("oom-") => {
            let want = match &c[4..] {
                "best" => "kprobe",
                m => m,
            };
            if method != want {
                why.push(format!("attached by {method}, expected {want}"));
            }
            let wpid = st.get("wpid").copied().unwrap_or(0);
            if st.get("wrc") != Some(&137) {
                why.push(format!("workload not OOM-killed: {:?}", st.get("wrc")));
            }
            let kills: Vec<_> = of_type(&v, "oom_kill")
                .into_iter()
                .filter(|k| k["victim_pid"] == wpid)
                .collect();
            if kills.len() != 1 {
                why.push(format!("{} kills of {wpid} reported", kills.len()));
            }
            if let Some(k) = kills.first() {
                let mut expect = |field: &str, want: Value| {
                    if k[field] != want {
                        why.push(format!("{field} {} != {want}", k[field]));
                    }
                };
                expect("victim_comm", "memtrace-worklo".into());
                expect("memcg", format!("/mt-{c}").into());
                // A 64 MiB limit in 4 KiB pages, from oom_control where the
                // method sees it (kprobe, fentry), else from the memcg limit.
                expect("pages", 16384.into());
                let source = if matches!(want, "kprobe" | "fentry") {
                    "oom_control"
                } else {
                    "memcg_limit"
                };
                expect("pages_source", source.into());
                expect("method", want.into());
                if k["anon_rss_kb"].as_u64().unwrap_or(0) <= 32 * 1024 {
                    why.push(format!("anon_rss_kb {} too small", k["anon_rss_kb"]));
                }
            }
        }
        "faults" => {
            let user: u64 = of_type(&v, "faults")
                .iter()
                .map(|r| r["user"].as_u64().unwrap_or(0))
                .sum();
            if user < 2000 {
                why.push(format!("{user} user faults < 2000"));
            }
        }
        "drsnoop" => {
            // The kernel reclaims in the memcg before it kills: stalls of the
            // workload, memcg kind, in its cgroup.
            let wpid = st.get("wpid").copied().unwrap_or(0);
            if st.get("wrc") != Some(&137) {
                why.push(format!("workload not OOM-killed: {:?}", st.get("wrc")));
            }
            let stalls: Vec<_> = of_type(&v, "reclaim_stall")
                .into_iter()
                .filter(|s| s["pid"] == wpid)
                .collect();
            if stalls.is_empty() {
                why.push(format!("no reclaim stall of {wpid}"));
            }
            if !stalls
                .iter()
                .all(|s| s["kind"] == "memcg" && s["memcg"] == "/mt-drsnoop")
            {
                why.push(format!("stalls not in /mt-drsnoop: {stalls:?}"));
            }
        }
        "brkstack" => {
            let hit = of_type(&v, "brk_stack")
                .iter()
                .any(|s| s["count"] == 50 && s["bytes"] == 204800);
            if !hit {
                why.push("no brk stack with count 50 and 204800 bytes".into());
            }
        }
        _ => {}
    }
    if case != "doctor" {
        let lost = of_type(&v, "summary")
            .first()
            .map(|s| s["lost_total"].clone());
        if lost != Some(0.into()) {
            why.push(format!("lost_total {lost:?}"));
        }
    }
    (method, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_guest_lines() {
        let g = parse(
            "noise\r\nMT-INFO kernel=6.1 cgroup=v1\r\nMT-OUT faults {\"a\":1}\n\
             [  1.0] MT-CASE faults rc=0 wrc=0 wpid=0 ms=1234\nMT-END PASS\n",
        );
        assert_eq!(g.info, "kernel=6.1 cgroup=v1");
        assert_eq!(g.out["faults"], ["{\"a\":1}"]);
        assert_eq!(g.cases["faults"]["ms"], 1234);
        assert_eq!(g.end.as_deref(), Some("PASS"));
    }
}
