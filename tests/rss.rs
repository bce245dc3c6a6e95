//! `memtrace rss`: figures agree with /proc, the threshold fires once at the
//! crossing step with the allocating stack, --fail exits 3, --exclude works.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const MIB: u64 = 1 << 20;

/// Starts the workload (pid printed, then waiting), memtrace on it, then lets
/// it run; returns memtrace's output and the workload's step lines.
fn traced(pre: &[&str], work: &[&str], extra: &[&str], on_step: impl Fn(u32, &str)) -> Output {
    let mut c = Command::new(workload_bin());
    c.args(pre)
        .arg("--wait")
        .args(work)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let lines = lines_of(child.stdout.take().unwrap());
    let pid: u32 = lines.recv_timeout(WAIT).unwrap().trim().parse().unwrap();
    let pid_s = pid.to_string();
    let mut args = vec!["rss", "-p", &pid_s, "--json", "-i", "200ms"];
    args.extend_from_slice(extra);
    let t = Tracer::start(&args);
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    // Its lines until it exits (the channel closes with its stdout).
    let deadline = std::time::Instant::now() + WAIT;
    while let Ok(l) =
        lines.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
    {
        on_step(pid, &l);
    }
    wait_child(&mut child, WAIT);
    t.wait(Duration::from_secs(20))
}

fn status_kb(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

#[test]
fn threshold_fires_once_at_the_crossing_step_with_the_allocating_stack() {
    // Four steps of 16 MiB: 40 MiB is crossed during the third.
    let out = traced(
        &[],
        &["steps", "16", "4", "300"],
        &["--threshold", "40MiB", "--fail"],
        |_, _| {},
    );
    assert_eq!(out.code, 3, "--fail must exit 3: {}", out.stderr);
    let ev = json_of(&out.stdout, "rss_threshold");
    assert_eq!(ev.len(), 1, "{}", out.stdout);
    let rss = ev[0]["rss_kb"].as_u64().unwrap() * 1024;
    assert!(
        rss > 40 * MIB && rss < 48 * MIB + 8 * MIB,
        "crossed at {rss}: {}",
        ev[0]
    );
    let st = json_of(&out.stdout, "rss_threshold_stack");
    let user = user_frames(&st[0]);
    assert!(
        user.iter().any(|f| f.contains("allocate_and_touch_mib")),
        "{user:?}"
    );
    assert!(
        !json_of(&out.stdout, "rss_mapping").is_empty(),
        "no pmap-like breakdown"
    );
}

#[test]
fn no_threshold_no_exit_3_and_anon_matches_proc_status() {
    let seen = std::sync::Mutex::new(0u64);
    let out = traced(
        &[],
        &["steps", "16", "3", "1200"],
        &["--fail", "--threshold", "1G"],
        |pid, l| {
            if l == "step 2" {
                // In the final pause: memory is still and memtrace reports every 200 ms.
                std::thread::sleep(Duration::from_millis(500));
                *seen.lock().unwrap() = status_kb(pid, "RssAnon:");
            }
        },
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let proc_anon = *seen.lock().unwrap();
    assert!(proc_anon > 48 * 1024, "{proc_anon}");
    let rows = json_of(&out.stdout, "rss");
    let best = rows
        .iter()
        .map(|r| r["anon_kb"].as_u64().unwrap())
        .min_by_key(|a| a.abs_diff(proc_anon))
        .unwrap();
    assert!(
        best.abs_diff(proc_anon) * 100 <= proc_anon,
        "memtrace anon {best} kB vs /proc RssAnon {proc_anon} kB"
    );
    let peak = rows
        .iter()
        .map(|r| r["peak_kb"].as_u64().unwrap())
        .max()
        .unwrap();
    assert!(peak >= proc_anon, "peak {peak} < {proc_anon}");
}

#[test]
fn exclude_by_size_leaves_that_mapping_out_of_the_threshold() {
    // 24 MiB mapped and touched before tracing, then 3 x 8 MiB: about 50 MiB
    // in all, but under 30 MiB without the 24 MiB region.
    let work = ["steps", "8", "3", "300"];
    let with = traced(
        &["--extra-mib", "24"],
        &work,
        &["--threshold", "30MiB", "--exclude", "24MiB"],
        |_, _| {},
    );
    assert_eq!(
        json_of(&with.stdout, "rss_threshold").len(),
        0,
        "{}",
        with.stdout
    );
    let rows = json_of(&with.stdout, "rss");
    assert!(
        rows.iter().any(|r| r["rss_kb"].as_u64().unwrap() >= r["counted_kb"].as_u64().unwrap() + 24 * 1024),
        "{}",
        with.stdout
    );
    let without = traced(
        &["--extra-mib", "24"],
        &work,
        &["--threshold", "30MiB"],
        |_, _| {},
    );
    assert_eq!(
        json_of(&without.stdout, "rss_threshold").len(),
        1,
        "{}",
        without.stdout
    );
}

#[test]
fn children_are_reported_per_process_and_summed() {
    let out = traced(&[], &["fork-alloc", "24"], &["--children"], |_, _| {});
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "rss");
    // The child's row, while it held its 24 MiB.
    let child = rows
        .iter()
        .filter(|r| r["pid"].is_u64() && r["anon_kb"].as_u64().unwrap() >= 24 * 1024)
        .max_by_key(|r| r["anon_kb"].as_u64().unwrap())
        .unwrap_or_else(|| panic!("no child row: {}", out.stdout));
    let child_pid = child["pid"].clone();
    let parents: Vec<_> = rows
        .iter()
        .filter(|r| r["pid"].is_u64() && r["pid"] != child_pid)
        .collect();
    assert!(!parents.is_empty(), "no parent row: {}", out.stdout);
    let totals: Vec<_> = rows.iter().filter(|r| r["comm"] == "TOTAL").collect();
    assert!(
        totals
            .iter()
            .any(|t| t["anon_kb"].as_u64().unwrap() >= 24 * 1024),
        "no TOTAL row with the child's memory: {}",
        out.stdout
    );
}

#[test]
fn exited_children_leave_the_table_and_its_total() {
    let out = traced(
        &[],
        &["fork-alloc", "24", "1000"],
        &["--children"],
        |_, _| {},
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "rss");
    // The traced process is listed first; its own exit ends the run.
    let target = rows[0]["pid"].clone();
    let last_rows: Vec<_> = rows
        .iter()
        .filter(|r| r["exited"] == true && r["pid"] != target)
        .collect();
    assert_eq!(
        last_rows.len(),
        1,
        "one last row for the child: {}",
        out.stdout
    );
    let child = last_rows[0]["pid"].clone();
    let ts = last_rows[0]["ts"].as_f64().unwrap();
    // Reports after it neither show the child nor count it in a TOTAL.
    let later: Vec<_> = rows
        .iter()
        .filter(|r| r["ts"].as_f64().unwrap() > ts)
        .collect();
    assert!(
        !later.is_empty(),
        "no report after the child exited: {}",
        out.stdout
    );
    assert!(later.iter().all(|r| r["pid"] != child), "{}", out.stdout);
    assert!(
        later.iter().all(|r| r["comm"] != "TOTAL"),
        "one process left: {}",
        out.stdout
    );
    let s = json_of(&out.stdout, "summary");
    // The child, then the traced process, whose exit ended the run.
    assert_eq!(s[0]["processes_exited"], 2, "{}", out.stdout);
    assert_eq!(
        s[0]["processes"], 2,
        "parent and child reported: {}",
        out.stdout
    );
    // The summary's events are the process rows printed (TOTAL is a sum).
    let printed = rows.iter().filter(|r| r["comm"] != "TOTAL").count();
    assert_eq!(s[0]["events"], printed as u64, "{}", out.stdout);
}

#[test]
fn a_process_over_the_threshold_at_start_is_reported_at_once() {
    // 24 MiB touched before tracing starts, then no change at all.
    let out = traced(
        &["--extra-mib", "24"],
        &["sleep", "1500"],
        &["--threshold", "16MiB", "--fail"],
        |_, _| {},
    );
    assert_eq!(out.code, 3, "--fail must exit 3: {}", out.stderr);
    let ev = json_of(&out.stdout, "rss_threshold");
    assert_eq!(ev.len(), 1, "{}", out.stdout);
    assert!(ev[0]["rss_kb"].as_u64().unwrap() >= 24 * 1024, "{}", ev[0]);
    let st = json_of(&out.stdout, "rss_threshold_stack");
    assert!(
        st[0]["note"]
            .as_str()
            .is_some_and(|n| n.contains("already")),
        "{}",
        out.stdout
    );
}

fn children_of(pid: u32) -> Vec<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    s.split_whitespace().map(|p| p.parse().unwrap()).collect()
}

/// Children that exist before tracing starts, idle, each holding 20 MiB:
/// every one is listed with what /proc says it holds (anon, file, shmem),
/// and TOTAL is what /proc says the family holds (it listed the parent
/// only: 1.7 MB of 68 MB).
#[test]
fn existing_children_are_listed_with_all_their_memory() {
    const N: usize = 3;
    let mut w = Workload::start(&["fork-hold", &N.to_string(), "20", "8000"]);
    w.go();
    assert_eq!(w.line().trim(), "ready");
    let kids = children_of(w.pid);
    assert_eq!(kids.len(), N);
    let pid = w.pid.to_string();
    let out = run(&[
        "rss",
        "-p",
        &pid,
        "--children",
        "--json",
        "-i",
        "500ms",
        "-d",
        "1.2",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "rss");
    // /proc now: the family is idle, so it holds what it held during the run.
    let family: Vec<u32> = std::iter::once(w.pid).chain(kids.iter().copied()).collect();
    let mut total = 0;
    for &p in &family {
        let row = rows
            .iter()
            .rev()
            .find(|r| r["pid"] == p)
            .unwrap_or_else(|| panic!("no row for {p}: {}", out.stdout));
        for (key, field) in [
            ("anon_kb", "RssAnon:"),
            ("file_kb", "RssFile:"),
            ("shmem_kb", "RssShmem:"),
        ] {
            let want = status_kb(p, field);
            let got = row[key].as_u64().unwrap();
            assert!(
                got.abs_diff(want) <= 64,
                "{p} {key}: {got} vs {want} kB: {row}"
            );
        }
        total += status_kb(p, "VmRSS:");
    }
    for &k in &kids {
        assert!(status_kb(k, "RssAnon:") >= 20 * 1024);
    }
    let last_total = rows
        .iter()
        .rev()
        .find(|r| r["comm"] == "TOTAL")
        .unwrap_or_else(|| panic!("no TOTAL: {}", out.stdout));
    let got = last_total["rss_kb"].as_u64().unwrap();
    assert!(
        got.abs_diff(total) <= 256,
        "TOTAL {got} vs /proc {total} kB"
    );
    let _ = w.child.kill();
    let _ = w.child.wait();
}

/// A process that exec'd and exited between two reports: its last row
/// carries the name it exec'd, not its parent's (it said "sh").
#[test]
fn an_exited_row_has_the_name_taken_at_exec() {
    let cmd = format!("{} touch 4000; sleep 0.6", workload_bin().display());
    let out = run(&["rss", "--json", "-i", "200ms", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "rss");
    let last = rows
        .iter()
        .find(|r| r["exited"] == true && r["peak_kb"].as_u64().unwrap_or(0) >= 16000)
        .unwrap_or_else(|| panic!("no exit row of the workload: {}", out.stdout));
    assert_eq!(last["comm"], "memtrace-worklo", "{}", out.stdout);
}

/// Children that live between two reports each get their exit row, with
/// their peak: they were dropped (43 of 400 shown, "0 lost") when the
/// followed set let them go before the next report read their counters.
#[test]
fn every_short_lived_child_gets_its_exit_row_with_its_peak() {
    const CHILDREN: usize = 300;
    // Each child touches 1024 fresh pages: 4 MiB over what it inherited.
    let cmd = format!(
        "{} fork-touch-many {CHILDREN} 1024",
        workload_bin().display()
    );
    let out = run(&["rss", "--json", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "rss");
    assert!(
        rows.iter()
            .all(|r| !r["comm"].as_str().unwrap_or("").contains("(exited)")),
        "exit is a field, not a name: {}",
        out.stdout
    );
    let exits: Vec<_> = rows.iter().filter(|r| r["exited"] == true).collect();
    let mut children: Vec<u64> = exits
        .iter()
        .filter(|r| r["peak_kb"].as_u64().unwrap_or(0) >= 4096)
        .map(|r| r["pid"].as_u64().unwrap())
        .collect();
    let rows_of_children = children.len();
    children.sort();
    children.dedup();
    // Each exit row's pid and peak, for a failure to say which row is extra.
    let seen: Vec<(u64, u64)> = exits
        .iter()
        .map(|r| {
            (
                r["pid"].as_u64().unwrap_or(0),
                r["peak_kb"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        rows_of_children, CHILDREN,
        "one exit row per child: (pid, peak_kb) {seen:?}"
    );
    assert_eq!(children.len(), CHILDREN, "one exit row per child");
    // The children and the command itself, each once.
    assert_eq!(exits.len(), CHILDREN + 1, "{}", out.stdout.len());
    let s = json_of(&out.stdout, "summary");
    assert_eq!(s[0]["processes_exited"], CHILDREN as u64 + 1);
    assert_eq!(s[0]["processes_unattributed"], 0);
    assert_eq!(s[0]["lost_total"], 0);
}
