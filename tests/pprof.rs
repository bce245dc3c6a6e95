//! `--pprof`: profiles read back by protoc against pprof's published
//! schema (tests/pprof/profile.proto), not by memtrace, with exact figures
//! from workloads with known counts.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;

/// protoc's text for a gzip'd profile, or None (with a skip) without protoc.
fn decode(test: &str, file: &Path) -> Option<String> {
    if !installed("protoc", "--version") {
        skip(test, "protoc is not installed (apt protobuf-compiler)");
        return None;
    }
    let gz = std::fs::read(file).unwrap();
    assert_eq!(&gz[..2], [0x1f, 0x8b], "not gzip'd");
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
    let schema = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("pprof");
    let mut p = Command::new("protoc")
        .arg(format!("--proto_path={}", schema.display()))
        .args(["--decode=perftools.profiles.Profile", "profile.proto"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut p.stdin.take().unwrap(), &raw).unwrap();
    let out = p.wait_with_output().unwrap();
    assert!(out.status.success(), "protoc could not decode it");
    Some(String::from_utf8(out.stdout).unwrap())
}

/// The profile as protoc printed it: sample types, samples (leaf-first
/// function names, values) and labels' strings.
struct Profile {
    types: Vec<(String, String)>,
    samples: Vec<(Vec<String>, Vec<i64>)>,
}

/// `field: value` lines inside each top-level `name { ... }` block.
fn blocks<'a>(text: &'a str, name: &str) -> Vec<Vec<(&'a str, &'a str)>> {
    let mut out = Vec::new();
    let mut cur: Option<Vec<(&str, &str)>> = None;
    let mut depth = 0;
    for l in text.lines() {
        let t = l.trim();
        if depth == 0 && t == format!("{name} {{") {
            cur = Some(Vec::new());
        }
        if t.ends_with('{') {
            depth += 1;
        } else if t == "}" {
            depth -= 1;
            if depth == 0 {
                if let Some(b) = cur.take() {
                    out.push(b);
                }
            }
        } else if let (Some(b), Some((k, v))) = (cur.as_mut(), t.split_once(": ")) {
            b.push((k, v));
        }
    }
    out
}

fn parse(text: &str) -> Profile {
    let strings: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("string_table: "))
        .map(|s| s.trim_matches('"').to_string())
        .collect();
    let num = |v: &str| v.parse::<i64>().unwrap();
    let field = |b: &[(&str, &str)], k: &str| b.iter().find(|f| f.0 == k).map_or(0, |f| num(f.1));
    let functions: HashMap<i64, String> = blocks(text, "function")
        .iter()
        .map(|b| (field(b, "id"), strings[field(b, "name") as usize].clone()))
        .collect();
    let locations: HashMap<i64, String> = blocks(text, "location")
        .iter()
        .map(|b| (field(b, "id"), functions[&field(b, "function_id")].clone()))
        .collect();
    let types = blocks(text, "sample_type")
        .iter()
        .map(|b| {
            let s = |k| strings[field(b, k) as usize].clone();
            (s("type"), s("unit"))
        })
        .collect();
    let samples = blocks(text, "sample")
        .iter()
        .map(|b| {
            let frames = b
                .iter()
                .filter(|f| f.0 == "location_id")
                .map(|f| locations[&num(f.1)].clone())
                .collect();
            let values = b
                .iter()
                .filter(|f| f.0 == "value")
                .map(|f| num(f.1))
                .collect();
            (frames, values)
        })
        .collect();
    Profile { types, samples }
}

/// The values summed over samples whose leaf frame is in `func`.
fn at_leaf(p: &Profile, func: &str) -> Vec<i64> {
    let mut sum = vec![0; p.types.len()];
    for (frames, v) in &p.samples {
        if frames.first().is_some_and(|f| f.contains(func)) {
            for (s, x) in sum.iter_mut().zip(v) {
                *s += x;
            }
        }
    }
    sum
}

fn scratch(name: &str) -> PathBuf {
    scratch_dir("pprof", name)
}

/// memleak's live --pprof and report --pprof of its record: in-use objects
/// and bytes at the leaking functions, exactly what the workload holds.
#[test]
fn memleak_pprof_holds_the_leaks_exactly_live_and_from_a_record() {
    let test = "memleak_pprof_holds_the_leaks_exactly_live_and_from_a_record";
    let d = scratch("memleak");
    let (live, rec, from_rec) = (d.join("live.pb.gz"), d.join("m.rec"), d.join("rec.pb.gz"));
    // 7 blocks of 1,000 bytes and 3 of 1 MiB held, 200 rounds freed.
    let cmd = format!("{} leak 7 1000 3 1048576 200 0", workload_bin().display());
    let out = run(&[
        "memleak",
        "-c",
        &cmd,
        "--pprof",
        live.to_str().unwrap(),
        "--record",
        rec.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rep = run(&[
        "report",
        rec.to_str().unwrap(),
        "--pprof",
        from_rec.to_str().unwrap(),
    ]);
    assert_eq!(rep.code, 0, "{}", rep.stderr);
    for file in [&live, &from_rec] {
        let Some(text) = decode(test, file) else {
            return;
        };
        let p = parse(&text);
        let types: Vec<(&str, &str)> = p
            .types
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        assert_eq!(
            types,
            [("inuse_objects", "count"), ("inuse_space", "bytes")]
        );
        assert_eq!(at_leaf(&p, "leak_small_blocks"), [7, 7000], "{text}");
        assert_eq!(at_leaf(&p, "leak_big_blocks"), [3, 3 << 20], "{text}");
        assert_eq!(at_leaf(&p, "churn_and_free"), [0, 0], "{text}");
    }
}

/// The record memtrace makes for a --pprof without --record is not left
/// behind.
#[test]
fn pprof_alone_leaves_no_record_behind() {
    let own = || -> usize {
        std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("memtrace-pprof-") && n.ends_with(".rec")
            })
            .count()
    };
    let before = own();
    let d = scratch("alone");
    let file = d.join("b.pb.gz");
    let cmd = format!("{} rawbrk 10 4096", workload_bin().display());
    let out = run(&["brkstack", "-c", &cmd, "--pprof", file.to_str().unwrap()]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(file.exists());
    assert_eq!(own(), before);
}

/// faults --stacks --pprof: 3,000 page faults under the touching function.
#[test]
fn faults_pprof_counts_the_touched_pages() {
    let test = "faults_pprof_counts_the_touched_pages";
    let d = scratch("faults");
    let file = d.join("f.pb.gz");
    let cmd = format!("{} touch 3000", workload_bin().display());
    let out = run(&[
        "faults",
        "--stacks",
        "-c",
        &cmd,
        "--pprof",
        file.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let Some(text) = decode(test, &file) else {
        return;
    };
    let p = parse(&text);
    assert_eq!(p.types, [("faults".to_string(), "count".to_string())]);
    let under: i64 = p
        .samples
        .iter()
        .filter(|(f, _)| f.iter().any(|f| f.contains("touch_fresh_pages")))
        .map(|(_, v)| v[0])
        .sum();
    assert_eq!(under, 3000, "{text}");
}

/// memcg --heap's pprof: the victim's held heap at its OOM kill, as in-use
/// objects and bytes at the function that grew it (an estimate from
/// samples: 70-120 MiB of a 96 MiB group), not the growth stacks beside.
#[test]
fn memcg_heap_pprof_is_the_victims_heap_at_the_kill() {
    let test = "memcg_heap_pprof_is_the_victims_heap_at_the_kill";
    if memcg_root().is_none() {
        skip(test, "no memory cgroup controller (v1 or v2)");
        return;
    }
    let d = scratch("memcg-heap");
    let file = d.join("heap.pb.gz");
    let cg = Memcg::new("pprofheap", "96M");
    let path = format!("/{}", cg.name);
    let mut tracer = Tracer::start(&[
        "memcg",
        "--cgroup",
        &path,
        "--heap",
        "--warn",
        "50",
        "--pprof",
        file.to_str().unwrap(),
        "--json",
    ]);
    cg.grow_until_killed();
    let seen = tracer.stdout_line(|l| l.contains("\"memcg_oom_heap\""), WAIT);
    assert!(seen.is_some(), "no heap report at the kill");
    let out = tracer.interrupt();
    assert_eq!(out.code, 0, "{}", out.stderr);
    let Some(text) = decode(test, &file) else {
        return;
    };
    let p = parse(&text);
    let types: Vec<&str> = p.types.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(types, ["inuse_objects", "inuse_space"]);
    let held = at_leaf(&p, "grow_heap_mib");
    let mib = held[1] as f64 / (1 << 20) as f64;
    assert!((70.0..=120.0).contains(&mib), "{mib} MiB: {held:?}");
}
