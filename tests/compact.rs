//! `memtrace compactsnoop`: the compaction runs of a command that writes to
//! /proc/sys/vm/compact_memory, one per populated zone per write.

mod common;

use common::*;

/// Names ("Node 0 DMA32") of the zones with pages, as /proc/zoneinfo has
/// them: a write to compact_memory compacts each once.
fn populated_zones() -> Vec<String> {
    let text = std::fs::read_to_string("/proc/zoneinfo").unwrap();
    let mut out = Vec::new();
    let mut zone = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Node ") {
            let (node, name) = rest.split_once(", zone").unwrap();
            zone = format!("Node {} {}", node.trim(), name.trim());
        } else if let Some(n) = line.trim().strip_prefix("present") {
            if n.trim().parse::<u64>().unwrap() > 0 {
                out.push(zone.clone());
            }
        }
    }
    out
}

#[test]
fn each_write_to_compact_memory_is_one_run_per_populated_zone() {
    if !std::path::Path::new("/proc/sys/vm/compact_memory").exists() {
        skip(
            "each_write_to_compact_memory_is_one_run_per_populated_zone",
            "no /proc/sys/vm/compact_memory (kernel without compaction)",
        );
        return;
    }
    const WRITES: usize = 3;
    let zones = populated_zones();
    assert!(!zones.is_empty());
    let out = run(&[
        "compactsnoop",
        "--json",
        "-c",
        "for i in 1 2 3; do echo 1 > /proc/sys/vm/compact_memory; done",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "compaction");
    assert_eq!(rows.len(), WRITES * zones.len(), "{}", out.stdout);
    for z in &zones {
        let n = rows.iter().filter(|r| r["zone"] == z.as_str()).count();
        assert_eq!(n, WRITES, "zone {z}: {}", out.stdout);
    }
    let pid = &rows[0]["pid"];
    for r in &rows {
        // The shell that wrote, not kcompactd nor anything else on the host.
        assert_eq!(&r["pid"], pid, "{r}");
        assert_eq!(r["comm"], "sh", "{r}");
        // A write compacts synchronously, for every order.
        assert_eq!(r["mode"], "sync", "{r}");
        assert!(r["order"].is_null(), "{r}");
        assert!(r["lat_ms"].as_f64().unwrap() > 0.0, "{r}");
        // A name from the kernel's enum, not a number.
        let st = r["status"].as_str().unwrap();
        assert!(
            st.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
            "{r}"
        );
    }
    // The histogram holds every run.
    let hist = json_of(&out.stdout, "histogram");
    assert_eq!(hist.len(), 1, "{}", out.stdout);
    let in_hist: u64 = hist[0]["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["count"].as_u64().unwrap())
        .sum();
    assert_eq!(in_hist as usize, rows.len());
}
