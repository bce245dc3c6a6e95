//! `memtrace brkstack`: brk calls by stack, heap growth, -c and --children.

mod bounds;
#[path = "../common/mod.rs"]
mod common;

use std::time::Duration;

use common::*;

fn stacks(stdout: &str) -> Vec<serde_json::Value> {
    json_of(stdout, "brk_stack")
}

fn totals(stdout: &str) -> (u64, u64) {
    stacks(stdout).iter().fold((0, 0), |(c, b), s| {
        (
            c + s["count"].as_u64().unwrap(),
            b + s["bytes"].as_u64().unwrap(),
        )
    })
}

fn traced(work: &[&str], extra: &[&str]) -> String {
    let mut args = vec!["brkstack"];
    args.extend_from_slice(extra);
    trace_workload(work, &[&args]).remove(0)
}

#[test]
fn counts_each_sbrk_and_the_heap_growth() {
    const N: u64 = 250;
    const SIZE: u64 = 8192;
    // What libc does by itself after the workload starts, measured, not guessed.
    let (base_calls, base_bytes) = totals(&traced(&["sbrk", "0", "0"], &[]));
    let out = traced(&["sbrk", &N.to_string(), &SIZE.to_string()], &[]);
    let (calls, bytes) = totals(&out);
    assert_eq!(calls, N + base_calls, "{out}");
    assert_eq!(bytes, N * SIZE + base_bytes, "{out}");
    // The loop's stack is the top one; glibc has no frame pointers, so a
    // frame-pointer stack ends in its __brk (see README: stacks through glibc).
    let top = &stacks(&out)[0];
    assert_eq!(top["count"], N);
    let frames = user_frames(top);
    assert!(
        frames.first().is_some_and(|f| f.starts_with("__brk")),
        "{frames:?}"
    );
}

#[test]
fn raw_brk_calls_are_counted_with_their_named_stack() {
    const N: u64 = 60;
    let out = traced(&["rawbrk", &N.to_string(), "4096"], &[]);
    let s = stacks(&out);
    // The function's stack: N calls of 4 KiB each in its loop and the
    // brk(0) before it, two call sites merged (frames are by function).
    let top = s
        .iter()
        .find(|s| s["count"] == N + 1)
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(top["bytes"], N * 4096);
    let frames = user_frames(top);
    assert!(frames[0].contains("grow_heap_with_raw_brk"), "{frames:?}");
    assert!(
        frames.iter().any(|f| f.contains("memtrace_workload::main")),
        "{frames:?}"
    );
}

#[test]
fn command_stacks_symbolize_after_the_command_exited() {
    let cmd = format!("{} rawbrk 40 4096", workload_bin().display());
    let out = run(&["brkstack", "--json", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s = stacks(&out.stdout);
    let top = s
        .iter()
        .find(|s| s["count"] == 40 + 1)
        .unwrap_or_else(|| panic!("{}", out.stdout));
    let frames = user_frames(top);
    assert!(frames[0].contains("grow_heap_with_raw_brk"), "{frames:?}");
}

/// `degraded.stack_truncated` of a run's summary; such stacks are
/// reported (cut), so none of them is among the losses.
fn truncated(stdout: &str) -> u64 {
    let summary = json_of(stdout, "summary").pop().unwrap();
    assert_eq!(summary["lost_total"], 0, "{summary}");
    summary["degraded"]["stack_truncated"].as_u64().unwrap()
}

/// A walked stack cut at either bound of the walk (frames kept, pages of
/// stack copied) is counted once per call; a stack that fits is not.
#[test]
fn stacks_cut_by_the_walk_are_counted() {
    const N: u64 = 20;
    let fp = &["--stack-mode", "fp"];
    let out = traced(&["rawbrk", &N.to_string(), "4096"], fp);
    assert_eq!(truncated(&out), 0, "{out}");
    // 200 small frames: more than the 128 the walk keeps.
    let out = traced(&["deepbrk", "200", &N.to_string()], fp);
    let (calls, _) = totals(&out);
    assert!(calls > N, "{out}");
    assert_eq!(truncated(&out), calls, "{out}");
    // 30 frames of 1 KiB: fewer frames, but more than the 16 KiB of stack
    // the walk copies.
    let out = traced(&["widebrk", "30", &N.to_string()], fp);
    let (calls, _) = totals(&out);
    assert!(calls > N, "{out}");
    assert_eq!(truncated(&out), calls, "{out}");
}

#[test]
fn children_are_followed_and_strangers_are_not() {
    const N: u64 = 30;
    let mut w = Workload::start(&["fork-sbrk", &N.to_string()]);
    let pid = w.pid.to_string();
    let t = Tracer::start(&["brkstack", "-p", &pid, "--children", "--json"]);
    // An unrelated process doing the same meanwhile.
    let stranger = status_within(
        std::process::Command::new(workload_bin()).args(["sbrk", "77", "4096"]),
        WAIT,
    );
    assert!(stranger.success());
    w.go();
    assert!(w.wait().success());
    let out = t.wait(Duration::from_secs(20));
    let s = stacks(&out.stdout);
    assert!(
        s.iter().any(|s| s["count"] == N && s["pid"] != w_pid(&pid)),
        "{}",
        out.stdout
    );
    assert!(
        !s.iter().any(|s| s["count"] == 77),
        "stranger counted: {}",
        out.stdout
    );
}

fn w_pid(p: &str) -> serde_json::Value {
    serde_json::json!(p.parse::<u64>().unwrap())
}

#[test]
fn folded_output_is_one_stack_per_line() {
    let cmd = format!("{} rawbrk 11 4096", workload_bin().display());
    let out = run(&["brkstack", "--folded", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(!lines.is_empty());
    for l in &lines {
        let (stack, count) = l.rsplit_once(' ').expect("count");
        assert!(count.parse::<u64>().is_ok(), "{l}");
        assert!(stack.starts_with("memtrace-worklo;"), "{l}");
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("grow_heap_with_raw_brk") && l.ends_with(" 12")),
        "{}",
        out.stdout
    );
    // inferno (the Rust flamegraph.pl) reads it and draws the function.
    let mut svg = Vec::new();
    let mut opts = inferno::flamegraph::Options::default();
    inferno::flamegraph::from_lines(&mut opts, lines.iter().copied(), &mut svg)
        .expect("inferno rejects the folded output");
    let svg = String::from_utf8(svg).unwrap();
    assert!(
        svg.contains("grow_heap_with_raw_brk"),
        "not in the flame graph"
    );
}

/// `--progress` counts calls as they are taken out of the kernel, not only
/// once a report has been made (it said "0 events" for whole runs).
#[test]
fn progress_counts_calls_before_the_report() {
    let w = workload_bin();
    let cmd = format!("{} sbrk 100 4096 && sleep 2.5", w.display());
    let out = run(&["brkstack", "--json", "--progress", "1", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let counts = progress_counts(&out.stderr);
    let summary = &json_of(&out.stdout, "summary")[0];
    let events = summary["events"].as_u64().unwrap();
    assert!(events >= 100, "{summary}");
    // The last line comes after everything ran (the sleep does not brk).
    assert_eq!(counts.last(), Some(&events), "{}", out.stderr);
}
