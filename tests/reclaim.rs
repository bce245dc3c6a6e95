//! Reclaim: drsnoop/vmscan see memcg reclaim of a workload; swapin counts
//! the pages read back from swap where kprobes or fentry and swap exist, and
//! refuses to run where neither kprobes nor fentry do.

mod common;

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use common::*;

/// Skips (printing why) where no memory cgroup can be made.
fn memcg_here(test: &str) -> bool {
    memcg_root().is_some() || {
        skip(test, "no memory cgroup controller (v1 or v2)");
        false
    }
}

/// `memtrace ARGS` while the workload rereads a 96 MiB file twice in a
/// 32 MiB memory cgroup `name` (page cache reclaimed in the group), then
/// `linger` for the last reports: memtrace's output, the workload's pid and
/// the group's path.
fn reread_in_memcg(name: &str, args: &[&str], linger: Duration) -> (Output, u32, String) {
    let path = std::env::temp_dir().join(format!("memtrace-{name}-{}", std::process::id()));
    std::fs::write(&path, vec![1u8; 96 << 20]).unwrap();
    let cg = Memcg::new(name, "32M");
    let t = Tracer::start(args);
    let mut child = cg
        .command(&workload_bin())
        .args(["reread", path.to_str().unwrap(), "2"])
        .spawn()
        .unwrap();
    let pid = child.id();
    assert!(wait_child(&mut child, WAIT).success());
    std::thread::sleep(linger);
    let out = t.interrupt();
    std::fs::remove_file(&path).unwrap();
    (out, pid, format!("/{}", cg.name))
}

#[test]
fn drsnoop_reports_memcg_reclaim_stalls_of_the_workload() {
    if !memcg_here("drsnoop_reports_memcg_reclaim_stalls_of_the_workload") {
        return;
    }
    let (out, pid, memcg) = reread_in_memcg("reclaim", &["drsnoop", "--json"], Duration::ZERO);
    let stalls = json_of(&out.stdout, "reclaim_stall");
    let ours: Vec<_> = stalls.iter().filter(|s| s["pid"] == pid).collect();
    assert!(!ours.is_empty(), "no stall for {pid}: {}", out.stdout);
    assert!(ours.iter().all(|s| s["kind"] == "memcg"), "{ours:?}");
    assert!(
        ours.iter()
            .map(|s| s["pages"].as_u64().unwrap())
            .sum::<u64>()
            > 0
    );
    assert!(ours.iter().any(|s| s["memcg"] == memcg), "{ours:?}");
}

#[test]
fn vmscan_rows_show_memcg_reclaim_time() {
    if !memcg_here("vmscan_rows_show_memcg_reclaim_time") {
        return;
    }
    let args = ["vmscan", "--json", "-P", "300ms"];
    let (out, pid, _) = reread_in_memcg("vmscan", &args, Duration::from_millis(700));
    let rows = json_of(&out.stdout, "vmscan");
    let pages: u64 = rows
        .iter()
        .map(|r| r["memcg_pages"].as_u64().unwrap())
        .sum();
    assert!(pages > 0, "{}", out.stdout);
    let procs = json_of(&out.stdout, "vmscan_process");
    assert!(
        procs
            .iter()
            .any(|p| p["pid"] == pid && p["kind"] == "memcg"),
        "{}",
        out.stdout
    );
}

#[test]
fn swapin_exits_2_naming_kprobe_and_fentry() {
    if kprobes() || fentry() {
        // There it attaches; swapin_counts_exactly_the_pages_read_back runs.
        skip(
            "swapin_exits_2_naming_kprobe_and_fentry",
            "this kernel has kprobes or fentry",
        );
        return;
    }
    let out = run(&["swapin"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("kprobe") && out.stderr.contains("fentry"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("swap_read_folio"), "{}", out.stderr);
}

/// `memtrace-workload swap 64` in a 32 MiB memcg that may swap: once it has
/// touched its pages the limit is lifted, and it reads back the K pages it
/// finds in swap: exactly K swap-ins (the kernel matrix asserts the same on
/// zram, whose reads are synchronous and never read ahead).
#[test]
fn swapin_counts_exactly_the_pages_read_back() {
    let test = "swapin_counts_exactly_the_pages_read_back";
    if !kprobes() && !fentry() {
        skip(test, "no kprobes and no fentry: swapin cannot attach here");
        return;
    }
    if !swap_on() {
        skip(test, "no swap area is active (/proc/swaps)");
        return;
    }
    if !memcg_here(test) {
        return;
    }
    let cg = Memcg::swappable("swapin", "32M");
    let t = Tracer::start(&["swapin", "--json"]);
    let mut child = cg
        .command(&workload_bin())
        .args(["swap", "64"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let lines = lines_of(child.stdout.take().unwrap());
    let touched = lines.recv_timeout(WAIT).expect("the workload's first line");
    assert!(touched.starts_with("touched "), "{touched}");
    cg.lift();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let swapped = lines.recv_timeout(WAIT).expect("the workload's count");
    // "swapped K of N"
    let k: u64 = swapped
        .split_whitespace()
        .nth(1)
        .and_then(|k| k.parse().ok())
        .unwrap_or_else(|| panic!("{swapped}"));
    assert!(wait_child(&mut child, WAIT).success());
    let out = t.interrupt();
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(k > 0, "nothing was swapped out: {swapped}");
    let got: u64 = json_of(&out.stdout, "swapin")
        .iter()
        .filter(|r| r["pid"] == pid)
        .map(|r| r["swapins"].as_u64().unwrap())
        .sum();
    assert_eq!(got, k, "{}", out.stdout);
}
