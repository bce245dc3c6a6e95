//! `memleak -p` with the shim loaded into the running process: exact
//! leaks, the process's allocator calls pointed at the shim only while
//! memtrace runs, and the process working as before once it ends.

mod common;

use std::time::Duration;

use common::*;

fn summary(stdout: &str) -> serde_json::Value {
    json_of(stdout, "summary")[0].clone()
}

/// memleak -p (with `extra`) on the got-watch workload around one round of
/// its leaks: what the workload said of its malloc slot during the run
/// ("changed" or "same"), memtrace's output, and the workload, still running.
fn watched(extra: &[&str]) -> (String, Output, Workload) {
    let mut w = Workload::start(&["got-watch", "7", "1000"]);
    let pid = w.pid.to_string();
    w.send("go");
    assert_eq!(w.line().trim(), "ready");
    let mut argv = vec!["memleak", "-p", &pid, "--json"];
    argv.extend_from_slice(extra);
    let t = Tracer::start(&argv);
    // The workload reads where its malloc calls go through its own GOT.
    w.send("during");
    let during = w.line().trim().to_string();
    t.signal(libc::SIGINT);
    let out = t.wait(Duration::from_secs(20));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "memleak");
    assert_eq!(
        held(&rows, "leak_small_blocks"),
        (7, 7000),
        "{}",
        out.stdout
    );
    (during, out, w)
}

#[test]
fn a_running_process_gets_the_shim_and_is_put_back_as_it_was() {
    let (during, out, mut w) = watched(&["-v"]);
    assert_eq!(during, "during changed", "{}", out.stderr);
    let s = summary(&out.stdout);
    let slots = s["injected_slots"].as_u64().unwrap();
    assert!(slots > 0, "{s}");
    assert_eq!(s["restored_slots"].as_u64(), Some(slots), "{s}");
    // 1,000 malloc/free pairs of churn went through the shim and are not held.
    assert!(s["frees"].as_u64().unwrap() >= 1000, "{s}");
    assert!(
        out.stderr.contains("allocator calls put back"),
        "{}",
        out.stderr
    );
    // After: calls go where they went before memtrace, and still work.
    w.send("after");
    assert_eq!(w.line().trim(), "after same");
    w.go();
    assert_eq!(w.line().trim(), "go same");
    assert!(w.wait().success());
}

#[test]
fn without_injection_uprobes_see_the_same_leaks() {
    let (during, out, mut w) = watched(&["--no-inject"]);
    // Nothing in the process changes under uprobes: the check can fail.
    assert_eq!(during, "during same");
    assert!(summary(&out.stdout).get("injected_slots").is_none());
    w.go();
    assert_eq!(w.line().trim(), "go same");
    assert!(w.wait().success());
}

/// A library the process loads while memleak -p runs (a dlopen) binds
/// malloc to glibc's, past the shim: at the next housekeeping round its
/// calls are pointed at the shim too, and it is said. Its leaks made after
/// that are all seen (none were before: the test fails without it).
#[test]
fn a_library_loaded_later_gets_its_calls_pointed_at_the_shim() {
    let lib = late_lib();
    let mut w = Workload::start(&["late-lib", lib.to_str().unwrap(), "11", "2000"]);
    let pid = w.pid.to_string();
    w.send("go");
    assert_eq!(w.line().trim(), "ready");
    let t = Tracer::start(&["memleak", "-p", &pid, "--json"]);
    w.send("load");
    assert_eq!(w.line().trim(), "loaded");
    // Rounds are 250 ms apart; each may find the library not relocated yet.
    std::thread::sleep(Duration::from_millis(1500));
    w.send("leak");
    assert_eq!(w.line().trim(), "leaked");
    t.signal(libc::SIGINT);
    let out = t.wait(Duration::from_secs(20));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "memleak");
    assert_eq!(held(&rows, "late_leak"), (11, 22000), "{}", out.stdout);
    assert!(
        out.stderr.contains("liblate.so after the shim went in"),
        "{}",
        out.stderr
    );
    let s = summary(&out.stdout);
    assert_eq!(s["libraries_redirected_late"], 1, "{s}");
    w.go();
    assert!(w.wait().success());
}

/// A thread waiting on a lock of the program's own (in the C library's
/// futex call) does not keep the shim out: every multithreaded service has
/// one (Redis's bio threads, jemalloc's background thread), and each was
/// refused ("every thread was inside its allocator or loader") and traced
/// by uprobes, Redis at a sixteenth of its throughput.
#[test]
fn a_thread_waiting_on_its_own_lock_does_not_keep_the_shim_out() {
    use std::io::{BufRead, Write};
    let py = "import threading, sys\n\
              ev = threading.Event()\n\
              t = threading.Thread(target=ev.wait)\n\
              t.start()\n\
              print('ready', flush=True)\n\
              sys.stdin.readline()\n\
              ev.set()\n";
    // A position-independent interpreter: a non-PIE one (Debian's) that
    // takes malloc's address gets uprobes, not the shim, whatever its
    // threads do.
    let Some(python) = std::fs::read_dir("/root/.pyenv/versions")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin/python3"))
        .find(|p| p.exists())
    else {
        return skip(
            "a_thread_waiting_on_its_own_lock_does_not_keep_the_shim_out",
            "no position-independent python3 (pyenv's)",
        );
    };
    let mut child = std::process::Command::new(python)
        .args(["-c", py])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let pid = child.id().to_string();
    let out = run(&["memleak", "-p", &pid, "-d", "1", "-v"]);
    child.stdin.take().unwrap().write_all(b"\n").unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!out.stderr.contains("uprobes instead"), "{}", out.stderr);
    assert!(
        out.stderr.contains("allocator calls put back"),
        "{}",
        out.stderr
    );
}
