//! `memcg --heap`: what the victim of an OOM kill held, by stack, from
//! sampled allocator calls of the watched group's processes; those that
//! start in the group and those that move in after memtrace started.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;

use common::*;

const MIB: f64 = (1 << 20) as f64;

fn memcg_here(test: &str) -> bool {
    memcg_root().is_some() || {
        skip(test, "no memory cgroup controller (v1 or v2)");
        false
    }
}

/// The OOM kill's heap report (after its other rows), once printed.
fn kill_report(mut tracer: Tracer) -> Output {
    let seen = tracer.stdout_line(|l| l.contains("\"memcg_oom_heap\""), WAIT);
    assert!(seen.is_some(), "no heap report at the kill");
    // The report's rows are printed together, before its summary at the end.
    tracer.interrupt()
}

/// Held bytes (estimated) of the victim's stacks through `func`.
fn held_through(rows: &[serde_json::Value], pid: u32, func: &str) -> f64 {
    rows.iter()
        .filter(|r| r["pid"] == pid)
        .filter(|r| user_frames(r).iter().any(|f| f.contains(func)))
        .map(|r| r["bytes"].as_u64().unwrap() as f64)
        .sum()
}

/// A process growing in `cg` until it is OOM-killed, beside `holder`
/// (killed after): the grower's pid, memtrace's output and the report of
/// what the group's other processes held.
fn others_at_kill(
    cg: &Memcg,
    mut tracer: Tracer,
    holder: &mut std::process::Child,
) -> (u32, Output, Vec<serde_json::Value>) {
    let grower = cg.grow_until_killed();
    let seen = tracer.stdout_line(|l| l.contains("\"memcg_oom_group_heap\""), WAIT);
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(seen.is_some(), "no report of the group's other holders");
    let out = tracer.interrupt();
    let others = json_of(&out.stdout, "memcg_oom_group_heap");
    (grower, out, others)
}

#[test]
fn the_victim_of_an_oom_kill_held_what_its_growing_function_allocated() {
    let name = "the_victim_of_an_oom_kill_held_what_its_growing_function_allocated";
    if !memcg_here(name) {
        return;
    }
    let cg = Memcg::new("heap", "128M");
    let path = format!("/{}", cg.name);
    let dir = scratch_dir("heap", "kill");
    let rec = dir.join("kill.rec");
    let tracer = Tracer::start(&[
        "memcg",
        "--cgroup",
        &path,
        "--heap",
        "--warn",
        "75",
        "--record",
        rec.to_str().unwrap(),
        "--json",
    ]);
    // 1 MiB from malloc every 10 ms, touched: killed at about 128 MiB.
    let pid = cg.grow_until_killed();
    let out = kill_report(tracer);
    let kills = json_of(&out.stdout, "memcg_oom");
    assert_eq!(kills.len(), 1, "{}", out.stdout);
    assert_eq!(kills[0]["victim_pid"], pid);
    let heap = json_of(&out.stdout, "memcg_oom_heap");
    let held = held_through(&heap, pid, "grow_heap_mib") / MIB;
    // Truth: what it had allocated when killed, 100-130 MiB of a 128 MiB
    // limit (the rest is its image); sampled, an estimate.
    assert!((100.0..=160.0).contains(&held), "{held} MiB: {heap:?}");
    // Complete stacks: down to _start through the program's main.
    let top = heap
        .iter()
        .filter(|r| r["pid"] == pid)
        .max_by_key(|r| r["bytes"].as_u64())
        .unwrap();
    let frames = user_frames(top);
    assert!(frames[0].contains("grow_heap_mib"), "{top}");
    assert!(frames.last().unwrap().starts_with("_start"), "{top}");
    // At the warning (75% of 128 MiB), what the grower held then.
    let warned = json_of(&out.stdout, "memcg_warn_heap");
    let then = held_through(&warned, pid, "grow_heap_mib") / MIB;
    assert!((60.0..=130.0).contains(&then), "{then} MiB: {warned:?}");
    assert!(then < held, "{then} MiB at the warning, {held} at the kill");
    // Through the allocator shim, loaded into the process as it came:
    // no trap per call (issue 36's cost).
    let sum = &json_of(&out.stdout, "summary")[0];
    assert!(sum["heap_shim_processes"].as_u64() >= Some(1), "{sum}");
    assert_eq!(sum["heap_shim_refused"].as_u64(), Some(0), "{sum}");
    // The same stacks in the record.
    let report = run_with(&["report", rec.to_str().unwrap()], WAIT);
    assert_eq!(report.code, 0, "{}", report.stderr);
    assert!(report.stdout.contains("grow_heap_mib"), "{}", report.stdout);
}

#[test]
fn a_process_that_moves_into_the_group_after_start_is_covered() {
    let name = "a_process_that_moves_into_the_group_after_start_is_covered";
    if !memcg_here(name) {
        return;
    }
    // Through the shim loaded into it when it is found there, and by
    // uprobes from its first call there.
    moved_in_is_covered(&[], "heap_shim_processes");
    moved_in_is_covered(&["--no-inject"], "heap_unprobed_processes");
}

fn moved_in_is_covered(how: &[&str], counter: &str) {
    let cg = Memcg::new("heapmove", "96M");
    let path = format!("/{}", cg.name);
    // Started outside the group, before memtrace.
    let mut w = Workload::start(&["heap-steps", "1", "1000", "10"]);
    let mut args = vec!["memcg", "--cgroup", &path, "--heap", "--json"];
    args.extend(how);
    let tracer = Tracer::start(&args);
    std::fs::write(cg.path.join("cgroup.procs"), w.pid.to_string()).unwrap();
    w.go();
    let st = wait_child(&mut w.child, WAIT);
    assert_eq!(st.signal(), Some(libc::SIGKILL), "not OOM-killed: {st:?}");
    let out = kill_report(tracer);
    let heap = json_of(&out.stdout, "memcg_oom_heap");
    let held = held_through(&heap, w.pid, "grow_heap_mib") / MIB;
    assert!((70.0..=120.0).contains(&held), "{held} MiB: {heap:?}");
    let sum = &json_of(&out.stdout, "summary")[0];
    let n = sum[counter].as_u64();
    match how.is_empty() {
        true => assert_eq!(n, Some(1), "{sum}"),
        // Uprobes: no shim, and every process probed.
        false => assert!(
            n == Some(0) && sum["heap_shim_processes"].is_null(),
            "{sum}"
        ),
    }
}

#[test]
fn heap_sample_needs_heap() {
    let out = run_with(&["memcg", "--heap-sample", "1M", "-d", "1"], WAIT);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("--heap"), "{}", out.stderr);
}

#[test]
fn oomkill_heap_shows_what_the_victim_held_wherever_the_kill_is() {
    let name = "oomkill_heap_shows_what_the_victim_held_wherever_the_kill_is";
    if !memcg_here(name) {
        return;
    }
    let cg = Memcg::new("heapoomkill", "96M");
    // Every process on the host, not a group's.
    let mut tracer = Tracer::start(&["oomkill", "--heap", "--json"]);
    let pid = cg.grow_until_killed();
    let seen = tracer.stdout_line(|l| l.contains("\"oom_heap\""), WAIT);
    assert!(seen.is_some(), "no heap report at the kill");
    let out = tracer.interrupt();
    // Host-wide: another program's kill may come first.
    let kills = json_of(&out.stdout, "oom_kill");
    assert!(
        kills.iter().any(|k| k["victim_pid"] == pid),
        "{}",
        out.stdout
    );
    let heap = json_of(&out.stdout, "oom_heap");
    let held = held_through(&heap, pid, "grow_heap_mib") / MIB;
    assert!((70.0..=120.0).contains(&held), "{held} MiB: {heap:?}");
    // Each kill's report holds its victim's stacks only (a kill of
    // another test's, host-wide, has its own report).
    let victims: Vec<&serde_json::Value> = kills.iter().map(|k| &k["victim_pid"]).collect();
    assert!(
        heap.iter().all(|r| victims.contains(&&r["pid"])),
        "the victims' stacks only: {heap:?}"
    );
}

#[test]
fn the_kill_report_names_what_the_group_s_other_processes_hold() {
    let name = "the_kill_report_names_what_the_group_s_other_processes_hold";
    if !memcg_here(name) {
        return;
    }
    let cg = Memcg::new("heapgroup", "128M");
    let path = format!("/{}", cg.name);
    let tracer = Tracer::start(&["memcg", "--cgroup", &path, "--heap", "--json"]);
    // A process holding 40 MiB, then one growing until it is killed.
    let mut holder = cg
        .command(&workload_bin())
        .args(["heap-steps", "1", "40", "2", "60000"])
        // Counted from the shim: allocate once it is in.
        .env("MEMTRACE_WAIT_SHIM_MS", "10000")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "held");
    let (grower, _, others) = others_at_kill(&cg, tracer, &mut holder);
    let held = held_through(&others, holder.id(), "grow_heap_mib") / MIB;
    assert!((25.0..=60.0).contains(&held), "{held} MiB: {others:?}");
    assert!(
        others.iter().all(|r| r["pid"] != grower),
        "the victim is reported apart: {others:?}"
    );
}

/// A process of the group that loads a library after the shim went in (a
/// dlopen, as Python imports an extension): the library's own calls of
/// malloc are pointed at the shim at a later round, so the kill report
/// names what the library holds (without it: nothing).
#[test]
fn a_library_a_process_loads_later_is_seen_in_the_kill_report() {
    let name = "a_library_a_process_loads_later_is_seen_in_the_kill_report";
    if !memcg_here(name) {
        return;
    }
    use std::io::{BufRead, Write};
    let lib = late_lib();
    let cg = Memcg::new("heaplate", "128M");
    let path = format!("/{}", cg.name);
    let tracer = Tracer::start(&["memcg", "--cgroup", &path, "--heap", "--json"]);
    let mut holder = cg
        .command(&workload_bin())
        .args(["late-lib", lib.to_str().unwrap(), "40", "1048576"])
        .env("MEMTRACE_WAIT_SHIM_MS", "10000")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to = holder.stdin.take().unwrap();
    let mut from = std::io::BufReader::new(holder.stdout.take().unwrap());
    let mut say = |line: &str, want: &str| {
        if !line.is_empty() {
            writeln!(to, "{line}").unwrap();
        }
        let mut got = String::new();
        from.read_line(&mut got).unwrap();
        assert_eq!(got.trim(), want);
    };
    say("", "ready");
    say("load", "loaded");
    // Rounds are 250 ms apart; each may find the library not relocated yet.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    say("leak", "leaked");
    let (grower, out, others) = others_at_kill(&cg, tracer, &mut holder);
    let held = held_through(&others, holder.id(), "late_leak") / MIB;
    assert!((28.0..=52.0).contains(&held), "{held} MiB: {others:?}");
    assert!(others.iter().all(|r| r["pid"] != grower), "{others:?}");
    assert!(
        out.stderr.contains("liblate.so after the shim went in"),
        "{}",
        out.stderr
    );
    let s = &json_of(&out.stdout, "summary")[0];
    assert_eq!(s["heap_shim_late_libraries"], 1, "{s}");
}
