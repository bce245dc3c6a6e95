//! Processes that start, fork and exit while traced: `-c` runs command
//! lines as the shell does, `--children` takes in existing descendants.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

fn faults_of(stdout: &str, pid: u32) -> u64 {
    json_of(stdout, "faults")
        .iter()
        .filter(|r| r["pid"] == pid)
        .map(|r| r["total"].as_u64().unwrap())
        .sum()
}

#[test]
fn a_command_line_runs_as_the_shell_runs_it_and_its_status_is_returned() {
    let w = workload_bin();
    let w = w.display();
    // A list, a pipeline and an exit status: every member traced.
    let cmd = format!("{w} touch 300; {w} touch 200 | cat; exit 7");
    let out = run(&["faults", "--json", "-c", &cmd]);
    assert_eq!(out.code, 7, "{}", out.stderr);
    let s = json_of(&out.stdout, "summary");
    assert_eq!(s[0]["command_status"], 7, "{}", out.stdout);
    let rows = json_of(&out.stdout, "faults");
    let work: Vec<u64> = rows
        .iter()
        .filter(|r| r["comm"] == "memtrace-worklo")
        .map(|r| r["total"].as_u64().unwrap())
        .collect();
    assert_eq!(work.len(), 2, "both workloads traced: {rows:?}");
    assert!(
        work.iter().any(|&n| n >= 300) && work.iter().all(|&n| n >= 200),
        "{rows:?}"
    );
    assert!(
        rows.iter().any(|r| r["comm"] == "cat"),
        "the pipeline's cat: {rows:?}"
    );
}

#[test]
fn output_keeps_the_report_apart_from_the_command_s_own_output() {
    let path = std::env::temp_dir().join(format!("memtrace-output-{}", std::process::id()));
    let p = path.to_str().unwrap();
    let out = run(&[
        "faults",
        "--json",
        "--output",
        p,
        "-c",
        "echo hello; echo world",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    // The command's lines on stdout, nothing of memtrace's there.
    assert_eq!(out.stdout, "hello\nworld\n");
    let report = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    // Every line of the file is memtrace's JSON, with its summary.
    assert!(
        report
            .lines()
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()),
        "{report}"
    );
    assert_eq!(json_of(&report, "summary").len(), 1, "{report}");
    // A file that cannot be created is bad input, before anything runs.
    let bad = run(&["faults", "--output", "/nonexistent/dir/x", "-c", "echo ran"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(!bad.stdout.contains("ran"), "{}", bad.stdout);
    assert_eq!(bad.stderr.trim().lines().count(), 1, "{}", bad.stderr);
}

#[test]
fn a_command_that_cannot_run_fails_the_run() {
    let out = run(&["faults", "-c", "/nonexistent/program"]);
    assert_eq!(out.code, 127, "{}", out.stderr);
}

/// A shell whose child workload exists (waiting for "go") before memtrace
/// starts: the child is a descendant memtrace was not there to see forked.
fn existing_child(extra: &[&str]) -> (u32, String) {
    let w = workload_bin();
    let mut sh = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("{} --wait touch 400; exit 0", w.display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(sh.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let child: u32 = line.trim().parse().expect("workload pid");
    let shell = sh.id().to_string();
    let mut args = vec!["faults", "--json", "-p", &shell];
    args.extend_from_slice(extra);
    let t = Tracer::start(&args);
    sh.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(sh.wait().unwrap().success());
    let out = t.wait(Duration::from_secs(20));
    assert_eq!(out.code, 0, "{}", out.stderr);
    (child, out.stdout)
}

#[test]
fn children_takes_in_existing_descendants() {
    let (child, out) = existing_child(&["--children"]);
    assert!(faults_of(&out, child) >= 400, "{out}");
    // Without --children the child is not followed: the check above can fail.
    let (child, out) = existing_child(&[]);
    assert_eq!(faults_of(&out, child), 0, "{out}");
}

/// Two processes of one binary running the same code path, from a shell;
/// the first interval report is taken while both are alive (symbolizing
/// stacks of processes gone before the report is another matter).
fn two_alike(extra: &[&str]) -> Vec<serde_json::Value> {
    let w = workload_bin();
    let w = w.display();
    let cmd = format!("{w} rawbrk 30 4096 1500 & {w} rawbrk 30 4096 1500; wait");
    let mut args = vec![
        "brkstack",
        "--stack-mode",
        "fp",
        "--json",
        "-i",
        "1",
        "--count",
        "1",
        "-c",
        &cmd,
    ];
    args.extend_from_slice(extra);
    let out = run(&args);
    assert_eq!(out.code, 0, "{}", out.stderr);
    json_of(&out.stdout, "brk_stack")
        .into_iter()
        .filter(|s| {
            user_frames(s)
                .first()
                .is_some_and(|f| f.contains("grow_heap_with_raw_brk"))
        })
        .collect()
}

#[test]
fn stacks_merge_by_function_across_processes_unless_asked() {
    // Each process: 30 calls in the loop and the brk(0) before it, two
    // call sites of one function.
    let merged = two_alike(&[]);
    assert_eq!(merged.len(), 1, "{merged:?}");
    assert_eq!(
        (merged[0]["count"].as_u64(), merged[0]["processes"].as_u64()),
        (Some(62), Some(2))
    );
    assert!(
        user_frames(&merged[0]).iter().all(|f| !f.contains("+0x")),
        "{merged:?}"
    );
    let apart = two_alike(&["--per-pid"]);
    let mut counts: Vec<u64> = apart.iter().map(|s| s["count"].as_u64().unwrap()).collect();
    counts.sort();
    assert_eq!(counts, [31, 31], "{apart:?}");
    let raw = two_alike(&["--addresses", "--per-pid"]);
    assert!(raw.len() >= 4, "call sites apart: {raw:?}");
    assert!(
        user_frames(&raw[0])[0].contains("grow_heap_with_raw_brk+0x"),
        "{raw:?}"
    );
}

fn brk_stacks(cmd: &str) -> Vec<serde_json::Value> {
    let out = run(&[
        "brkstack",
        "--stack-mode",
        "fp",
        "--per-pid",
        "--json",
        "-c",
        cmd,
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    json_of(&out.stdout, "brk_stack")
}

#[test]
fn a_forked_child_symbolizes_with_its_parents_maps_after_it_exits() {
    // The child calls sbrk 20 times and exits; its parent waits for it.
    let s = brk_stacks(&format!("{} fork-sbrk 20", workload_bin().display()));
    let child = s
        .iter()
        .find(|s| s["count"] == 20)
        .unwrap_or_else(|| panic!("{s:?}"));
    let f = user_frames(child);
    assert!(f[0].starts_with("__brk") && f[0].contains("libc"), "{f:?}");
}

#[test]
fn exec_d_children_symbolize_after_they_exit() {
    let w = workload_bin();
    let w = w.display();
    let s = brk_stacks(&format!("{w} rawbrk 30 4096 & {w} rawbrk 30 4096; wait"));
    let named: Vec<_> = s
        .iter()
        .filter(|s| user_frames(s)[0].contains("grow_heap_with_raw_brk"))
        .collect();
    // Each: 30 calls in its loop and the brk(0) before it.
    assert_eq!(named.len(), 2, "{s:?}");
    assert!(named.iter().all(|s| s["count"] == 31), "{s:?}");
}

#[test]
fn a_stack_taken_before_an_exec_symbolizes_in_the_image_it_was_taken_in() {
    // 40 brk calls (and the brk(0) before them), then, 200 ms later (its
    // image read meanwhile), an exec of another program: the report, after
    // the exec and the exit, still names them.
    let s = brk_stacks(&format!(
        "{} brk-exec 40 4096 200 /bin/sleep 0.2",
        workload_bin().display()
    ));
    let before = s
        .iter()
        .find(|s| s["count"] == 41)
        .unwrap_or_else(|| panic!("{s:?}"));
    let f = user_frames(before);
    assert!(f[0].contains("grow_heap_with_raw_brk"), "{f:?}");
}

#[test]
fn memtrace_does_not_count_itself() {
    // System-wide, every syscall by process: memtrace makes many of its own
    // (polling, timers, reading its maps), none of which may show.
    let t = Tracer::start(&[
        "count",
        "raw_syscalls:sys_enter",
        "--by",
        "pid",
        "-d",
        "1",
        "--json",
    ]);
    let me = t.pid();
    // A process known to make syscalls while traced, so that the test does
    // not depend on the host being busy.
    let mut w = Workload::start(&["rawbrk", "50", "4096"]);
    let w_pid = w.pid;
    w.go();
    assert!(w.wait().success());
    let out = t.wait(Duration::from_secs(20));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "count");
    assert!(
        rows.iter()
            .any(|r| r["pid"] == w_pid && r["count"].as_u64() >= Some(50)),
        "workload {w_pid} not counted: {}",
        out.stdout
    );
    assert!(
        rows.iter().all(|r| r["pid"] != me),
        "memtrace ({me}) counted: {}",
        out.stdout
    );
}

/// `--top` counts a stack that several processes share by its sum: five
/// processes touching 100 pages each in one function outrank one touching
/// 300 in another, though each of the five alone is smaller.
#[test]
fn top_ranks_stacks_after_merging_processes() {
    let w = workload_bin();
    let w = w.display();
    let five = vec![format!("{w} touch 100 &"); 5].join(" ");
    let cmd = format!("{five} {w} zero-faults 300 1; wait");
    let out = run(&["faults", "--stacks", "--top", "1", "--json", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let stacks = json_of(&out.stdout, "fault_stack");
    assert_eq!(stacks.len(), 1, "{}", out.stdout);
    let top = &stacks[0];
    assert!(
        user_frames(top)
            .iter()
            .any(|f| f.contains("touch_fresh_pages")),
        "{}",
        out.stdout
    );
    assert_eq!(top["processes"], 5, "{}", out.stdout);
    assert!(top["count"].as_u64().unwrap() >= 500, "{}", out.stdout);
}
