//! What a guest printed: its `MT-` lines parsed by case, the cases the
//! guest runs (`tests/guest/init.sh`), and the checks common to all of them;
//! `tools.rs` checks each tool's output against what its workload did,
//! `doctor.rs` the doctor table against the cases.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

/// What one guest printed, by case.
#[derive(Default)]
pub(super) struct Guest {
    pub info: String,
    pub out: BTreeMap<String, Vec<String>>,
    pub err: BTreeMap<String, Vec<String>>,
    /// The workload's own report (`MT-WORK`).
    pub work: BTreeMap<String, Vec<String>>,
    pub cases: BTreeMap<String, BTreeMap<String, i64>>,
    /// Cases the guest could not run, with its reason (`MT-SKIP`).
    pub skipped: BTreeMap<String, String>,
    pub end: Option<String>,
    pub console: String,
    pub wall: Duration,
}

impl Guest {
    /// An arm64 guest (its kernel's release says so).
    pub fn arm64(&self) -> bool {
        self.info.contains("-arm64 ")
    }

    /// The kernel version of its `MT-INFO` line, as (major, minor).
    pub fn kernel(&self) -> Option<(u32, u32)> {
        let v = self
            .info
            .split_whitespace()
            .find_map(|w| w.strip_prefix("kernel="))?;
        let mut n = v.split(['.', '-', '+']).map(|x| x.parse::<u32>().ok());
        Some((n.next()??, n.next()??))
    }
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
            "MT-WORK" => g.work.entry(case.into()).or_default().push(body.into()),
            "MT-CASE" => {
                let kv = body
                    .split_whitespace()
                    .filter_map(|f| f.split_once('='))
                    .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
                    .collect();
                g.cases.insert(case.into(), kv);
            }
            "MT-SKIP" => {
                g.skipped.insert(case.into(), body.into());
            }
            "MT-END" => g.end = Some(case.to_string()),
            _ => {}
        }
    }
    g
}

pub(super) fn json(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

pub(super) fn of_type<'a>(v: &'a [Value], ty: &str) -> Vec<&'a Value> {
    v.iter().filter(|x| x["type"] == ty).collect()
}

/// What a case's memtrace prints, and so where its attach methods and
/// losses are read.
#[derive(PartialEq)]
pub(super) enum Out {
    /// JSON Lines on stdout, ending with a summary object.
    Json,
    /// Text on stdout; `-v` attach lines and the loss summary on stderr.
    Text,
    /// A record read back (report, diff): nothing attached, nothing lost.
    Replay,
}

/// One case of the guest's script.
pub(super) struct Case {
    pub name: &'static str,
    pub tool: &'static str,
    pub out: Out,
    /// memtrace's exit status.
    pub rc: i64,
    /// The method it must attach by: forced with `--attach`, or the best
    /// one where the case runs with the default (then `forced` is false).
    pub method: Option<&'static str>,
    pub forced: bool,
}

pub(super) const fn case(name: &'static str, tool: &'static str) -> Case {
    Case {
        name,
        tool,
        out: Out::Json,
        rc: 0,
        method: None,
        forced: false,
    }
}

const fn text(name: &'static str, tool: &'static str) -> Case {
    Case {
        out: Out::Text,
        ..case(name, tool)
    }
}

const fn replay(name: &'static str, tool: &'static str) -> Case {
    Case {
        out: Out::Replay,
        ..case(name, tool)
    }
}

const fn best(name: &'static str, tool: &'static str, method: &'static str) -> Case {
    Case {
        method: Some(method),
        ..case(name, tool)
    }
}

const fn forced(name: &'static str, tool: &'static str, method: &'static str) -> Case {
    Case {
        method: Some(method),
        forced: true,
        ..case(name, tool)
    }
}

/// Every case, in the order the guest runs them; doctor is checked last.
pub(super) const CASES: [Case; 35] = [
    case("doctor", "doctor"),
    best("oom-best", "oomkill", "kprobe"),
    forced("oom-fentry", "oomkill", "fentry"),
    forced("oom-tp_btf", "oomkill", "tp_btf"),
    forced("oom-tracepoint", "oomkill", "tracepoint"),
    case("drsnoop", "drsnoop"),
    case("memcg", "memcg"),
    case("heap", "memcg"),
    // --fail: the usage warning came.
    Case {
        rc: 3,
        ..case("warn-fail", "memcg")
    },
    // cgroup v2 only (PSI triggers on memory.pressure): skipped elsewhere.
    case("psi", "memcg"),
    // --fail: the pressure warning came.
    Case {
        rc: 3,
        ..case("psi-fail", "memcg")
    },
    best("swapin-best", "swapin", "kprobe"),
    forced("swapin-kprobe", "swapin", "kprobe"),
    forced("swapin-fentry", "swapin", "fentry"),
    case("vmscan", "vmscan"),
    case("compactsnoop", "compactsnoop"),
    case("faults-base", "faults"),
    case("faults", "faults"),
    case("brkstack", "brkstack"),
    case("faults-dwarf", "faults"),
    case("count", "count"),
    case("trace", "trace"),
    best("memleak", "memleak", "uprobe"),
    // 20 runs of memleak's case where the kernel's walker takes stacks.
    best("memleak-repeat", "memleak", "uprobe"),
    best("memleak-shim", "memleak", "uprobe"),
    case("ffaults", "ffaults"),
    // --fail: the threshold was crossed.
    Case {
        rc: 3,
        ..case("rss", "rss")
    },
    case("mmapsnoop", "mmapsnoop"),
    case("shmsnoop", "shmsnoop"),
    text("top", "top"),
    text("serve", "serve"),
    // Recorded runs of brkstack, then read back from their records.
    case("record-a", "brkstack"),
    case("record-b", "brkstack"),
    replay("report", "report"),
    replay("diff", "diff"),
];

/// The probe whose method a tool's row shows.
fn main_probe(case: &str, tool: &str) -> &'static str {
    if case == "memleak-shim" {
        return "allocations (preloaded shim)";
    }
    match tool {
        "oomkill" => "oom kill",
        "faults" => "user page faults",
        "ffaults" => "file page faults",
        "brkstack" => "brk calls",
        "count" | "trace" => "syscalls:sys_enter_madvise",
        "memleak" => "allocator calls and returns",
        "drsnoop" | "vmscan" => "memcg reclaim end",
        "rss" => "rss changes",
        "memcg" => "rss changes in the groups",
        "mmapsnoop" => "mmap entry",
        "shmsnoop" => "shmget entry",
        "swapin" => "swap-ins",
        "top" | "serve" => "user page faults",
        _ => "-",
    }
}

/// `(probe, method)` of every probe a case attached: from its summary, or
/// for text output from its `-v` lines (`memtrace: PROBE: attached METHOD
/// TARGET`).
pub(super) fn attached_of(g: &Guest, case: &Case) -> Vec<(String, String)> {
    match case.out {
        Out::Json => attached(&json(g.out.get(case.name).map_or(&[][..], |v| v))),
        Out::Text => g
            .err
            .get(case.name)
            .into_iter()
            .flatten()
            .filter_map(|l| {
                let (probe, rest) = l.strip_prefix("memtrace: ")?.split_once(": attached ")?;
                Some((probe.into(), rest.split_whitespace().next()?.into()))
            })
            .collect(),
        Out::Replay => Vec::new(),
    }
}

/// Events lost, from the summaries (a repeated case has one a run), or for
/// text output from the last line on stderr (`memtrace TOOL: 4.0s, 8896
/// events, 0 lost`).
fn lost(g: &Guest, case: &Case, v: &[Value]) -> Option<u64> {
    match case.out {
        Out::Json => {
            let s = of_type(v, "summary");
            s.first()?;
            s.iter().map(|s| s["lost_total"].as_u64()).sum()
        }
        Out::Text => g
            .err
            .get(case.name)?
            .iter()
            .rev()
            .find(|l| l.starts_with(&format!("memtrace {}: ", case.tool)))?
            .strip_suffix(" lost")?
            .rsplit(' ')
            .next()?
            .parse()
            .ok(),
        Out::Replay => Some(0),
    }
}

/// Stacks that could not be copied, when they are all a copied run of
/// faults-dwarf lost and at most 1% of its events: arm64's copies every
/// fault's stack, and a few faults find no readable stack at the stack
/// pointer (counted, and said, by memtrace).
fn copies_unread(case: &Case, v: &[Value]) -> Option<u64> {
    let s = of_type(v, "summary").into_iter().next()?;
    let n = s["lost"]["stack_copy_fail"].as_u64()?;
    let ok = case.name == "faults-dwarf"
        && s["unwinder"] == "copy"
        && n * 100 <= s["events"].as_u64()?;
    ok.then_some(n)
}

/// `(probe, method)` of every probe the summary says attached.
fn attached(v: &[Value]) -> Vec<(String, String)> {
    of_type(v, "summary")
        .first()
        .and_then(|s| s["attached"].as_array())
        .into_iter()
        .flatten()
        .map(|p| {
            let s = |k: &str| p[k].as_str().unwrap_or("-").to_string();
            (s("probe"), s("method"))
        })
        .collect()
}

/// The result of one case on one guest.
pub(super) struct Checked {
    pub case: &'static Case,
    pub method: String,
    pub why: Vec<String>,
    /// Why the guest could not run it: neither pass nor fail.
    pub skip: Option<String>,
}

/// Checks every case of a guest; doctor's check uses the others' results.
pub(super) fn check_all(g: &Guest) -> Vec<Checked> {
    let mut done: Vec<Checked> = CASES[1..].iter().map(|c| check(g, c)).collect();
    let doctor = super::doctor::check(g, &CASES[0], &done);
    done.insert(0, doctor);
    done
}

/// Checks one case's output: ran, exit status, method, nothing lost, and the
/// tool's own checks.
fn check(g: &Guest, case: &'static Case) -> Checked {
    let mut why = Vec::new();
    if let Some(reason) = g.skipped.get(case.name) {
        return Checked {
            case,
            method: "-".into(),
            why,
            skip: Some(reason.clone()),
        };
    }
    let Some(st) = g.cases.get(case.name) else {
        return Checked {
            case,
            method: "-".into(),
            why: vec!["did not run".into()],
            skip: None,
        };
    };
    let rc = st.get("rc").copied().unwrap_or(-1);
    // DWARF stacks need bpf_loop (5.17): refused where it is missing, and
    // said; a skip, not a pass.
    let said = |what: &str| {
        g.err
            .get(case.name)
            .into_iter()
            .flatten()
            .any(|l| l.contains(what))
    };
    if case.name == "faults-dwarf" && rc == 2 && said("this kernel has no bpf_loop") {
        return Checked {
            case,
            method: "-".into(),
            why,
            skip: Some("no bpf_loop: DWARF stacks refused, as said".into()),
        };
    }
    if rc != case.rc {
        why.push(format!("memtrace exited with {rc}, expected {}", case.rc));
    }
    let v = json(g.out.get(case.name).map_or(&[][..], |v| v));
    let probe = main_probe(case.name, case.tool);
    let method = attached_of(g, case)
        .into_iter()
        .find(|(p, _)| p == probe)
        .map_or_else(|| "-".to_string(), |(_, m)| m);
    // The shim's sites share one uprobe_multi link per program where the
    // kernel has them (6.6), else a uprobe each.
    let want = match case.method {
        Some("uprobe") if case.name == "memleak-shim" && g.kernel() >= Some((6, 6)) => {
            Some("uprobe_multi")
        }
        w => w,
    };
    if let Some(want) = want {
        if method != want {
            why.push(format!("{probe}: attached by {method}, expected {want}"));
        }
    }
    match lost(g, case, &v) {
        Some(0) => {}
        Some(n) if copies_unread(case, &v) == Some(n) => {}
        n => why.push(format!("lost {n:?}")),
    }
    super::tools::check(g, case, &v, &mut why);
    Checked {
        case,
        method,
        why,
        skip: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_guest_lines() {
        let g = parse(
            "noise\r\nMT-INFO kernel=6.1 cgroup=v1\r\nMT-OUT faults {\"a\":1}\n\
             [  1.0] MT-CASE faults rc=0 wrc=0 wpid=0 ms=1234\nMT-WORK swapin swapped 3 of 9\n\
             MT-SKIP psi cgroup v1 guest\nMT-END PASS\n",
        );
        assert_eq!(g.info, "kernel=6.1 cgroup=v1");
        assert_eq!(g.out["faults"], ["{\"a\":1}"]);
        assert_eq!(g.cases["faults"]["ms"], 1234);
        assert_eq!(g.work["swapin"], ["swapped 3 of 9"]);
        assert_eq!(g.skipped["psi"], "cgroup v1 guest");
        assert_eq!(g.end.as_deref(), Some("PASS"));
    }
}
