//! `memtrace faults` and `ffaults` against workloads with known fault counts.

mod bounds;
#[path = "../common/mod.rs"]
mod common;

use std::time::Duration;

use common::*;

/// Runs the workload under `faults -p` with `extra` options; returns stdout.
fn traced(work: &[&str], extra: &[&str]) -> String {
    let mut args = vec!["faults"];
    args.extend_from_slice(extra);
    let out = trace_workload(work, &[&args]).remove(0);
    assert!(out.contains("\"lost_total\":0"), "events lost: {out}");
    out
}

fn user_faults(stdout: &str) -> u64 {
    json_of(stdout, "faults")
        .iter()
        .map(|r| r["user"].as_u64().unwrap())
        .sum()
}

/// `got` is the `n` faults made, plus at most the workload's own start-up
/// faults (`base`, measured) and `over` more; `under` fewer only where a
/// test says why.
fn assert_counted(what: &str, got: u64, n: u64, base: u64, under: u64, over: u64) {
    assert!(
        got + under >= n && got <= n + base + over,
        "{what}: got {got}, expected {n} + baseline {base}"
    );
}

#[test]
fn counts_exactly_the_pages_touched() {
    const N: u64 = 5000;
    // The workload's own faults outside the loop (stack, exit path), measured.
    let base = user_faults(&traced(&["touch", "0"], &[]));
    let got = user_faults(&traced(&["touch", &N.to_string()], &[]));
    assert_counted("faults -p", got, N, base, 0, 2);
}

/// Every way of attaching counts the same: tp_btf (kernel BTF parsed by aya
/// only then), the classic tracepoint, and the software page-fault perf
/// event (with its own preallocated map).
#[test]
fn every_attach_method_counts_exactly() {
    const N: u64 = 3000;
    for method in ["tp_btf", "tracepoint", "perf_event"] {
        let base = user_faults(&traced(&["touch", "0"], &["--attach", method]));
        let out = traced(&["touch", &N.to_string()], &["--attach", method]);
        let summary = json_of(&out, "summary").pop().unwrap();
        assert_eq!(summary["attached"][0]["method"], method, "{summary}");
        let got = user_faults(&out);
        assert_counted(method, got, N, base, 0, 2);
    }
}

#[test]
fn exact_with_threads_on_both_cpus() {
    const T: u64 = 4;
    const N: u64 = 20000;
    let base = user_faults(&traced(&["threads", &T.to_string(), "0"], &[]));
    let got = user_faults(&traced(&["threads", &T.to_string(), &N.to_string()], &[]));
    assert_counted("threads", got, T * N, base, 0, 8);
}

/// Processes counted in the per-CPU slots, in the hash map where slots
/// collide, and in a slot taken over from a process that exited: each exact
/// when summed over intervals. Two slots and sequential pids: the shell
/// holds one, the workloads take turns in the other.
#[test]
fn exact_when_count_slots_collide_and_are_taken_over() {
    const N: u64 = 3000;
    let w = workload_bin().display().to_string();
    // Start-up faults from exec on, as the script's workloads are seen.
    let out = run(&["faults", "--json", "-c", &format!("{w} touch 0")]);
    let base = user_faults(&out.stdout);
    let script = format!(
        "{w} touch {N}; sleep 0.6; {w} touch {N}; sleep 0.6; {w} touch {N} & {w} touch {N} & wait"
    );
    let cmd = format!("sh -c '{script}'");
    let out = run(&[
        "faults", "--slots", "2", "-i", "100ms", "--json", "-c", &cmd,
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let mut per_pid: std::collections::BTreeMap<u64, u64> = Default::default();
    for r in json_of(&out.stdout, "faults") {
        // Named after their exec, though their first faults came as the
        // forked shell's.
        if r["comm"] == "memtrace-worklo" {
            *per_pid.entry(r["pid"].as_u64().unwrap()).or_default() += r["user"].as_u64().unwrap();
        }
    }
    assert_eq!(per_pid.len(), 4, "{per_pid:?}\n{}", out.stdout);
    for (pid, got) in per_pid {
        // Slack for the forked shell's own faults before it execs.
        assert_counted(&format!("pid {pid}"), got, N, base, 0, 32);
    }
}

/// Interval reports taken while the workload faults add up to the whole,
/// exactly, by slots and by hash map (`--slots 0`). The hash map's keys
/// are taken by count generation: read and deleted while a program still
/// added to them, 2-6 of 400,000 were lost (270-350 reading all, then
/// deleting).
#[test]
fn interval_reports_add_up() {
    const N: u64 = 400_000;
    for slots in ["1024", "0"] {
        let opts = ["--slots", slots, "-i", "20ms"];
        let base = user_faults(&traced(&["touch", "0"], &opts));
        let out = traced(&["touch", &N.to_string()], &opts);
        let reports = json_of(&out, "faults").len();
        assert!(reports >= 3, "only {reports} reports: {out}");
        let got = user_faults(&out);
        assert_counted(&format!("--slots {slots}"), got, N, base, 0, 2);
    }
}

#[test]
fn stacks_put_the_touching_function_on_top() {
    let out = traced(&["touch", "3000"], &["--stacks"]);
    let stacks = json_of(&out, "fault_stack");
    let in_touch = |s: &serde_json::Value| {
        user_frames(s)
            .iter()
            .any(|f| f.starts_with("memtrace_workload::touch_fresh_pages"))
    };
    // The loop is unrolled: several call sites in the function, each a stack.
    assert!(in_touch(stacks.first().expect("stacks")), "{out}");
    let total: u64 = stacks
        .iter()
        .filter(|s| in_touch(s))
        .map(|s| s["count"].as_u64().unwrap())
        .sum();
    // Every one: a fault counted while the periodic drain took its key
    // out of the per-CPU map was lost about one run in 60 before the
    // drain took only keys of an ended count generation.
    assert_eq!(total, 3000, "{out}");
}

#[test]
fn by_mapping_attributes_the_faults_to_the_anonymous_region() {
    // With -c the maps are read when the command exits, before its memory goes.
    let cmd = format!("{} touch 4000", workload_bin().display());
    let out = run(&["faults", "--by-mapping", "--json", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "fault_mapping");
    let anon: u64 = rows
        .iter()
        .filter(|r| r["mapping"] == "[anon]")
        .map(|r| r["faults"].as_u64().unwrap())
        .max()
        .unwrap_or(0);
    assert!(anon >= 4000, "{rows:?}");
}

/// Children that fault a file their parent mapped and exit at once: each
/// file is named (198 of 200 were `[dev M:N inode I]`, their maps read
/// after they were gone), though the parent itself exits before the report.
#[test]
fn ffaults_names_files_of_children_gone_before_their_maps_were_read() {
    const N: usize = 60;
    let dir = std::env::temp_dir().join(format!("memtrace-ffaults-kids-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let mut w = Workload::start(&["fork-fault-files", &N.to_string(), d]);
    let pid = w.pid.to_string();
    let t = Tracer::start(&["ffaults", "-p", &pid, "--children", "--json"]);
    w.go();
    assert!(w.wait().success());
    let out = t.wait(Duration::from_secs(20));
    std::fs::remove_dir_all(&dir).unwrap();
    let rows = json_of(&out.stdout, "file_faults");
    let unnamed: Vec<_> = rows
        .iter()
        .filter(|r| r["file"].as_str().is_some_and(|f| f.starts_with("[dev")))
        .collect();
    assert!(unnamed.is_empty(), "unnamed: {unnamed:?}");
    for i in 0..N {
        let f = format!("{d}/file-{i}");
        let row = rows
            .iter()
            .find(|r| r["file"] == f.as_str())
            .unwrap_or_else(|| panic!("{f} not in {rows:?}"));
        // One read; a fault that waited for its page is entered again
        // (VM_FAULT_RETRY), as bpftrace's ffaults counts it too.
        let n = row["faults"].as_u64().unwrap();
        assert!((1..=2).contains(&n), "{row}");
    }
}

#[test]
fn ffaults_names_the_file_with_its_faults() {
    const K: u64 = 300;
    let path = std::env::temp_dir().join(format!("memtrace-ffaults-{}", std::process::id()));
    std::fs::write(&path, vec![7u8; (K as usize + 10) * 4096]).unwrap();
    let p = path.to_str().unwrap();
    let mut w = Workload::start(&["readfile", p, &K.to_string()]);
    let pid = w.pid.to_string();
    let t = Tracer::start(&["ffaults", "-p", &pid, "--json"]);
    w.go();
    assert!(w.wait().success());
    let out = t.wait(Duration::from_secs(20));
    std::fs::remove_file(&path).unwrap();
    let rows = json_of(&out.stdout, "file_faults");
    let ours = rows
        .iter()
        .find(|r| r["file"] == p)
        .unwrap_or_else(|| panic!("{p} not in {rows:?}"));
    assert!(ours["faults"].as_u64().unwrap() >= K, "{ours}");
}
