//! Processes that exec and exit within milliseconds, traced without `-c`
//! (system-wide, or `-p PID --children`): their maps are gone before
//! memtrace could read /proc, so what they mapped is learned in the kernel,
//! at exec and at each executable mmap.

mod common;

use std::time::Duration;

use common::*;

/// Children of the traced workload, one after the other, each running
/// `child` and exiting.
const CHILDREN: usize = 3;

/// Runs `tool ARGS` while a workload runs `exec-short CHILDREN child...`;
/// system-wide (`extra` empty: stopped with SIGINT once the workload is
/// done) or on the workload's pid (`extra` = `-p`), with `--children`.
fn traced(tool: &[&str], follow: bool, child: &[&str]) -> Vec<serde_json::Value> {
    let n = CHILDREN.to_string();
    let mut wargs = vec!["exec-short", &n];
    wargs.extend_from_slice(child);
    let mut w = Workload::start(&wargs);
    let pid = w.pid.to_string();
    let mut args = tool.to_vec();
    args.extend_from_slice(&["--stack-mode", "fp", "--json"]);
    if follow {
        args.extend_from_slice(&["-p", &pid, "--children"]);
    }
    let t = Tracer::start(&args);
    w.go();
    assert!(w.wait().success());
    if !follow {
        // Records still in flight reach memtrace before it ends.
        std::thread::sleep(Duration::from_millis(300));
        t.signal(libc::SIGINT);
    }
    let out = t.wait(Duration::from_secs(30));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let ty = if tool[0] == "faults" {
        "fault_stack"
    } else {
        "brk_stack"
    };
    json_of(&out.stdout, ty)
}

/// Each child faults 50 pages in glibc's memset, called from the workload's
/// `fill_with_memset`, called from `fault_in_libc`: the stack names the
/// library's function (in libc) and the workload's (in its binary).
fn memset_faults(follow: bool) {
    // Every stack: a busy host's own can outnumber the children's.
    let stacks = traced(
        &["faults", "--stacks", "--top", "100000"],
        follow,
        &["memset-pages", "50"],
    );
    let ours: Vec<_> = stacks
        .iter()
        .filter(|s| {
            user_frames(s)
                .first()
                .is_some_and(|f| f.contains("memset") && f.contains("libc"))
        })
        .filter(|s| {
            user_frames(s)
                .iter()
                .any(|f| f.contains("fault_in_libc") && f.contains("memtrace-workload"))
        })
        .collect();
    assert_eq!(ours.len(), 1, "{stacks:#?}");
    // Every child, but now and then one: a child gone before memtrace read
    // its maps has its libc frames as `[code not placed: ...]` (counted,
    // shown with that reason, not lost). Seen in 2-4 of 20 system-wide
    // runs on this host at the end of the fourth session; open on issue 33.
    let count = ours[0]["count"].as_u64().unwrap();
    assert!(count >= 50 * (CHILDREN as u64 - 1), "{stacks:#?}");
    assert_eq!(count % 50, 0, "{stacks:#?}");
    let procs = ours[0]["processes"].as_u64().unwrap();
    assert_eq!(procs * 50, count, "{:#?}", ours[0]);
}

#[test]
fn short_lived_exec_d_processes_symbolize_system_wide() {
    memset_faults(false);
}

#[test]
fn short_lived_exec_d_children_symbolize_with_children() {
    memset_faults(true);
}

/// brk system-wide: each child's 20 brk calls in the workload binary's own
/// code, and the process gone before the report.
#[test]
fn short_lived_brk_stacks_symbolize_system_wide() {
    let stacks = traced(
        &["brkstack", "--top", "100000"],
        false,
        &["rawbrk", "20", "4096"],
    );
    let ours: Vec<_> = stacks
        .iter()
        .filter(|s| {
            user_frames(s)
                .first()
                .is_some_and(|f| f.contains("grow_heap_with_raw_brk"))
        })
        .collect();
    // Each: 20 calls in its loop and the brk(0) before it, all counted.
    // Now and then a child is gone before memtrace read its maps: its libc
    // frames are `[code not placed: ...]` (counted, shown with that
    // reason), so its calls are a row apart; the same race as the faults
    // test above, open on issue 33. Seen once in a clean-clone CI run.
    let sum = |key: &str| -> u64 { ours.iter().map(|s| s[key].as_u64().unwrap()).sum() };
    assert_eq!(sum("count"), 21 * CHILDREN as u64, "{stacks:#?}");
    assert_eq!(sum("processes"), CHILDREN as u64, "{stacks:#?}");
    let placed: Vec<_> = ours
        .iter()
        .filter(|s| !user_frames(s).iter().any(|f| f.contains("code not placed")))
        .collect();
    assert_eq!(placed.len(), 1, "{stacks:#?}");
    assert!(
        placed[0]["processes"].as_u64().unwrap() >= CHILDREN as u64 - 1,
        "{stacks:#?}"
    );
}

/// Page faults of processes a moment old, in code without frame pointers:
/// their first faults come before their tables, and the kernel finds each
/// frame's file (`bpf_find_vma`) by the mappings it found for the process
/// on earlier faults. A fault's program runs with interrupts off, where the
/// lookup answers once per event: before the found mappings were kept, all
/// frames but the first were walked by frame pointers (88% of a churn's
/// fault stacks), and through this code they were lost.
#[test]
fn fault_stacks_of_processes_a_moment_old_unwind_whole() {
    const N: u64 = 20;
    let c = common::nofp::c_workload().display().to_string();
    // The first run waits a second before its work, so that memtrace has
    // read its maps (at its first faults' miss) and has the files' rows
    // for those after it; each of those is gone within milliseconds.
    let cmd = format!(
        "(sleep 1; echo) | WORKLOAD_HANDSHAKE=1 {c} touch 50 >/dev/null; \
         for i in $(seq {}); do {c} touch 50; done",
        N - 1
    );
    // System-wide: `-c` holds each exec until the new image's table is in.
    let t = Tracer::start(&["faults", "--stacks", "--json", "--top", "100000"]);
    let ran = std::process::Command::new("sh").args(["-c", &cmd]).status();
    assert!(ran.unwrap().success());
    std::thread::sleep(Duration::from_millis(300));
    t.signal(libc::SIGINT);
    let out = t.wait(Duration::from_secs(30));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = out.stdout;
    let whole: Vec<_> = json_of(&out, "fault_stack")
        .into_iter()
        .filter(|s| {
            let f = user_frames(s);
            f.first().is_some_and(|x| x.contains("pages_touch_inner"))
                && f.iter().all(|x| !x.starts_with('['))
                && common::nofp::at(&f, "pages_touch_outer").is_some()
                && f.last().is_some_and(|x| x.starts_with("_start"))
        })
        .collect();
    let n: u64 = whole.iter().map(|s| s["count"].as_u64().unwrap()).sum();
    assert_eq!(n, 50 * N, "{out}");
}
