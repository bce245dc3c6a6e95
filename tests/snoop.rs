//! `memtrace mmapsnoop` and `memtrace shmsnoop`: every call of a workload
//! with known arguments, matched to what the workload itself printed.

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;

const PAGE: u64 = 4096;

/// Runs `work` under `tool -p PID --json EXTRA`; returns memtrace's events of
/// type `ty`, the workload's own report and its pid.
fn traced(tool: &str, ty: &str, work: &[&str], extra: &[&str]) -> (Vec<Value>, String, u64) {
    let mut w = Workload::start(work);
    let pid = w.pid.to_string();
    let mut args = vec![tool, "-p", &pid, "--json"];
    args.extend_from_slice(extra);
    let t = Tracer::start(&args);
    // The same calls from another process meanwhile: filtered out in the kernel.
    let stranger = status_within(
        std::process::Command::new(workload_bin())
            .args(work)
            .stdout(std::process::Stdio::null()),
        WAIT,
    );
    assert!(stranger.success());
    w.go();
    let (st, report) = w.wait_output();
    assert!(st.success(), "{report}");
    let out = t.wait(Duration::from_secs(20));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let events = json_of(&out.stdout, ty);
    let p: u64 = pid.parse().unwrap();
    for e in &events {
        assert_eq!(e["pid"], p, "another process's call: {e}");
    }
    (events, report, p)
}

/// The workload's report lines starting with `tag`, split in words.
fn report_lines<'a>(report: &'a str, tag: &str) -> Vec<Vec<&'a str>> {
    report
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.first() == Some(&tag))
        .collect()
}

/// The one event matching `f`.
fn one<'a>(events: &'a [Value], what: &str, f: impl Fn(&Value) -> bool) -> &'a Value {
    let hits: Vec<&Value> = events.iter().filter(|e| f(e)).collect();
    assert_eq!(hits.len(), 1, "{what}: {hits:?}\nall: {events:#?}");
    hits[0]
}

fn temp_file(tag: &str, len: u64) -> String {
    let path = format!("/tmp/memtrace-test-{tag}-{}.bin", std::process::id());
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(len).unwrap();
    path
}

#[test]
fn mmapsnoop_shows_each_call_with_its_arguments_and_result() {
    let file = temp_file("mmapsnoop", 3 * PAGE);
    let (ev, report, _) = traced("mmapsnoop", "mmap_call", &["maps", &file], &[]);
    let _ = std::fs::remove_file(&file);

    // The regions of the workload's MAP_REGIONS, in order: pages, prot, flags.
    let expected = [
        (PAGE, "R--", "PRIVATE|ANONYMOUS"),
        (2 * PAGE, "RW-", "PRIVATE|ANONYMOUS"),
        (3 * PAGE, "---", "PRIVATE|ANONYMOUS"),
        (5 * PAGE, "R-X", "PRIVATE|ANONYMOUS|NORESERVE"),
    ];
    let mapped = report_lines(&report, "mmap");
    assert_eq!(mapped.len(), expected.len(), "{report}");
    for (m, (len, prot, flags)) in mapped.iter().zip(expected) {
        assert_eq!(m[2], len.to_string());
        let e = one(&ev, "mmap of a region", |e| {
            e["op"] == "mmap" && e["result"] == m[1]
        });
        assert_eq!(e["len"], len, "{e}");
        assert_eq!(e["prot"], prot, "{e}");
        assert_eq!(e["flags"], flags, "{e}");
        assert_eq!(e["addr"], "0x0", "{e}");
        assert_eq!(e["fd"], -1, "{e}");
        assert_eq!(e["file"], Value::Null, "{e}");
    }

    // mremap of region 1 from 2 to 7 pages.
    let r = &report_lines(&report, "mremap")[0];
    let e = one(&ev, "mremap", |e| e["op"] == "mremap");
    assert_eq!(e["addr"], r[1], "{e}");
    assert_eq!(e["len"], 2 * PAGE, "{e}");
    assert_eq!(e["new_len"], 7 * PAGE, "{e}");
    assert_eq!(e["flags"], "MAYMOVE", "{e}");
    assert_eq!(e["result"], r[2], "{e}");

    // The file, mapped shared and read-only, named.
    let f = &report_lines(&report, "file")[0];
    let e = one(&ev, "file mmap", |e| {
        e["op"] == "mmap" && e["result"] == f[1]
    });
    assert_eq!(e["len"], 3 * PAGE, "{e}");
    assert_eq!(e["prot"], "R--", "{e}");
    assert_eq!(e["flags"], "SHARED", "{e}");
    assert_eq!(e["fd"], f[3].parse::<i64>().unwrap(), "{e}");
    assert_eq!(e["file"], file.as_str(), "{e}");

    // Every munmap, with its length and success.
    let unmapped = report_lines(&report, "munmap");
    assert_eq!(unmapped.len(), 5, "{report}");
    for u in &unmapped {
        let e = one(&ev, "munmap", |e| e["op"] == "munmap" && e["addr"] == u[1]);
        assert_eq!(e["len"], u[2].parse::<u64>().unwrap(), "{e}");
        assert_eq!(e["result"], "0", "{e}");
    }

    // The two failed mmaps, by errno name (the workload printed -errno).
    let fails = report_lines(&report, "fail");
    assert_eq!(fails[0][2], "-22", "{report}"); // EINVAL
    assert_eq!(fails[1][2], "-12", "{report}"); // ENOMEM
    let e = one(&ev, "mmap of length 0", |e| e["result"] == "EINVAL");
    assert_eq!(e["op"], "mmap");
    assert_eq!(e["len"], 0);
    assert_eq!(e["prot"], "R--");
    let e = one(&ev, "mmap of 2^48 bytes", |e| e["result"] == "ENOMEM");
    assert_eq!(e["op"], "mmap");
    assert_eq!(e["len"], 1u64 << 48);
    assert_eq!(e["prot"], "RW-");
}

#[test]
fn mmapsnoop_failed_only_shows_just_the_failures() {
    let (ev, _, _) = traced("mmapsnoop", "mmap_call", &["maps"], &["-x"]);
    let results: Vec<&str> = ev.iter().map(|e| e["result"].as_str().unwrap()).collect();
    assert_eq!(results, ["EINVAL", "ENOMEM"], "{ev:#?}");
}

#[test]
fn mmapsnoop_stack_names_the_caller() {
    let (ev, _, _) = traced("mmapsnoop", "mmap_call", &["maps"], &["-x", "--stack"]);
    assert_eq!(ev.len(), 2, "{ev:#?}");
    for e in &ev {
        let frames = user_frames(e);
        // The workload issues these two from its own mmap_raw (no glibc frames).
        assert!(
            frames.first().is_some_and(|f| f.contains("mmap_raw")),
            "{frames:?}"
        );
        assert!(
            frames.iter().any(|f| f.contains("memtrace_workload::main")),
            "{frames:?}"
        );
    }
}

#[test]
fn shmsnoop_shows_the_four_calls_with_the_shmid() {
    let (ev, report, _) = traced("shmsnoop", "shm_call", &["shm"], &[]);
    let id = &report_lines(&report, "shmid")[0][1];
    let addr = &report_lines(&report, "shmat")[0][1];
    assert_eq!(ev.len(), 4, "{ev:#?}");
    let calls: Vec<&str> = ev.iter().map(|e| e["syscall"].as_str().unwrap()).collect();
    assert_eq!(calls, ["shmget", "shmat", "shmdt", "shmctl"]);
    // 16 pages, IPC_CREAT|0600, as the workload asks.
    assert_eq!(
        ev[0]["args"],
        "key=IPC_PRIVATE size=65536 shmflg=IPC_CREAT|0600"
    );
    assert_eq!(ev[0]["result"], *id);
    assert_eq!(ev[1]["args"], format!("shmid={id} shmaddr=0x0 shmflg=0"));
    assert_eq!(ev[1]["result"], *addr);
    assert_eq!(ev[2]["args"], format!("shmaddr={addr}"));
    assert_eq!(ev[2]["result"], "0");
    assert_eq!(ev[3]["args"], format!("shmid={id} cmd=IPC_RMID buf=0x0"));
    assert_eq!(ev[3]["result"], "0");
}

#[test]
fn shmsnoop_text_is_a_header_and_one_line_per_call() {
    let mut w = Workload::start(&["shm"]);
    let pid = w.pid.to_string();
    let t = Tracer::start(&["shmsnoop", "-p", &pid]);
    w.go();
    let (st, report) = w.wait_output();
    assert!(st.success());
    let out = t.wait(Duration::from_secs(20));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let id = &report_lines(&report, "shmid")[0][1];
    let lines: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 5, "{}", out.stdout);
    assert_eq!(
        lines[0],
        ["TIME", "PID", "COMM", "SYSCALL", "RESULT", "ARGS"]
    );
    // TIME PID COMM SYSCALL RESULT ARGS...
    assert_eq!(
        lines[1][1..5],
        [pid.as_str(), "memtrace-worklo", "shmget", id]
    );
    assert_eq!(
        lines[4][3..],
        [
            "shmctl",
            "0",
            &format!("shmid={id}"),
            "cmd=IPC_RMID",
            "buf=0x0"
        ]
    );
    assert!(out.stderr.contains("4 events, 0 lost"), "{}", out.stderr);
}

/// Streamed records wake memtrace in batches; a lone one must still be
/// printed soon (the drain timer), not only when the trace ends.
#[test]
fn a_lone_call_is_printed_while_its_process_runs() {
    // 1 MiB: glibc's malloc maps it with mmap; then the workload sleeps.
    let mut w = Workload::start(&["hold", "1"]);
    let pid = w.pid.to_string();
    let mut t = Tracer::start(&["mmapsnoop", "-p", &pid]);
    // Past memtrace's first look at the buffer, which is at once.
    std::thread::sleep(Duration::from_millis(300));
    w.go();
    let line = t.stdout_line(
        |l| l.contains(" mmap ") && l.contains("1048576"),
        Duration::from_secs(2),
    );
    let _ = w.child.kill();
    wait_child(&mut w.child, WAIT);
    let out = t.interrupt();
    assert!(line.is_some(), "not printed within 2 s: {}", out.stdout);
}

/// Summary numbers of `mmapsnoop -c WORK`: (events delivered, lost).
fn delivered_and_lost(extra: &[&str], calls: &str) -> (u64, u64) {
    // One malloc arena: a thread's own arena is a 128 MiB reservation trimmed
    // to alignment by one or two munmaps as ASLR falls, which made the calls
    // outside the loop 23 or 24 at random.
    let cmd = format!(
        "env MALLOC_ARENA_MAX=1 {} mmap-loop 1 {calls}",
        workload_bin().display()
    );
    let mut args = vec!["mmapsnoop", "-c", &cmd];
    args.extend_from_slice(extra);
    let out = run(&args);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let summary = out
        .stderr
        .lines()
        .find(|l| l.starts_with("memtrace mmapsnoop:"))
        .unwrap_or_else(|| panic!("no summary: {}", out.stderr))
        .to_string();
    // "... N events, M lost" or "... N events, M LOST (ringbuf_full=M)".
    let before = |word: &str| -> u64 {
        summary
            .split(", ")
            .find_map(|p| {
                p.strip_suffix(word)
                    .or_else(|| p.split_once(&format!(" {word} ")).map(|x| x.0))
            })
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no '{word}' in {summary}"))
    };
    let lost = if summary.contains(" LOST") {
        before("LOST")
    } else {
        before("lost")
    };
    (before("events"), lost)
}

/// A buffer far too small for the stream: records are lost, and every call
/// the workload made is either delivered or counted lost.
#[test]
fn a_small_buffer_loses_records_and_counts_every_one() {
    // The calls the workload makes outside its loop, with room to spare.
    let (base, base_lost) = delivered_and_lost(&[], "0");
    assert_eq!(base_lost, 0);
    // The smallest buffer (one page) and a long stream: a reader that is
    // never late would make this pass without losses, so keep it long.
    let n = 150_000;
    let (events, lost) = delivered_and_lost(&["--buffer-size", "4K"], &n.to_string());
    assert!(lost > 0, "a 4 KiB buffer kept up with {} records", 2 * n);
    assert_eq!(
        events + lost,
        base + 2 * n,
        "delivered {events}, lost {lost}"
    );
}
