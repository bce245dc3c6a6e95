//! Reclaim: drsnoop/vmscan see memcg reclaim of a workload; swapin refuses
//! to run without kprobe or fentry.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn drsnoop_reports_memcg_reclaim_stalls_of_the_workload() {
    let path = std::env::temp_dir().join(format!("memtrace-reclaim-{}", std::process::id()));
    std::fs::write(&path, vec![1u8; 96 << 20]).unwrap();
    let cg = Memcg::new("reclaim", "32M");
    let t = Tracer::start(&["drsnoop", "--json"]);
    let mut child = cg
        .command(&workload_bin())
        .args(["reread", path.to_str().unwrap(), "2"])
        .spawn()
        .unwrap();
    let pid = child.id();
    assert!(child.wait().unwrap().success());
    let out = t.interrupt();
    std::fs::remove_file(&path).unwrap();
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
    assert!(
        ours.iter().any(|s| s["memcg"] == format!("/{}", cg.name)),
        "{ours:?}"
    );
}

#[test]
fn vmscan_rows_show_memcg_reclaim_time() {
    let path = std::env::temp_dir().join(format!("memtrace-vmscan-{}", std::process::id()));
    std::fs::write(&path, vec![1u8; 96 << 20]).unwrap();
    let cg = Memcg::new("vmscan", "32M");
    let t = Tracer::start(&["vmscan", "--json", "-P", "300ms"]);
    let mut child = cg
        .command(&workload_bin())
        .args(["reread", path.to_str().unwrap(), "2"])
        .spawn()
        .unwrap();
    let pid = child.id();
    assert!(child.wait().unwrap().success());
    std::thread::sleep(Duration::from_millis(700));
    let out = t.interrupt();
    std::fs::remove_file(&path).unwrap();
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
    let out = run(&["swapin"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("kprobe") && out.stderr.contains("fentry"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("swap_read_folio"), "{}", out.stderr);
}
