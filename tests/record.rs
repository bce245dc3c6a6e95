//! `--record` and `memtrace report`: records of real runs on workloads with
//! known counts, read back as the live tool printed them.

mod common;
#[path = "record/util.rs"]
mod util;

use std::process::Command;

use common::*;
use util::*;

#[test]
fn report_prints_what_the_live_tool_printed() {
    let d = scratch("roundtrip");
    let live = record(&d, "t.rec", &w("rawbrk 40 4096"), &[]);
    let rep = mt(&d, &["report", "t.rec"]);
    assert_eq!(rep.code, 0, "{}", rep.stderr);
    assert!(
        live.stdout.contains("grow_heap_with_raw_brk"),
        "{}",
        live.stdout
    );
    assert_eq!(rep.stdout, live.stdout);
    assert!(rep.stderr.is_empty(), "{}", rep.stderr);

    // Tables too (faults by process).
    let live = mt(&d, &["faults", "-c", &w("touch 300"), "--record", "f.rec"]);
    assert!(live.stdout.contains("memtrace-worklo"), "{}", live.stdout);
    assert_eq!(mt(&d, &["report", "f.rec"]).stdout, live.stdout);

    let live = record(&d, "j.rec", &w("rawbrk 40 4096"), &["--json"]);
    let rep = mt(&d, &["report", "--json", "j.rec"]);
    assert_eq!(rep.code, 0, "{}", rep.stderr);
    let stacks = json_of(&rep.stdout, "brk_stack");
    assert_eq!(stacks, json_of(&live.stdout, "brk_stack"));
    // The loop's 40 calls and the brk(0) before them (see tests/brkstack/).
    let top = find(&stacks, "grow_heap_with_raw_brk", "memtrace_workload::main");
    assert_eq!(
        (top["count"].as_u64(), top["bytes"].as_u64()),
        (Some(41), Some(40 * 4096))
    );

    // Source lines were kept though the live tool did not show them.
    let lines = mt(&d, &["report", "--json", "--lines", "j.rec"]);
    let top = find(
        &json_of(&lines.stdout, "brk_stack"),
        "grow_heap_with_raw_brk",
        "main",
    )
    .clone();
    assert!(user_frames(&top)[0].contains("brk.rs:"), "{top}");
    // Folded and summed views, as the live --folded prints.
    let folded = mt(&d, &["report", "--folded", "--sum", "--top", "1", "j.rec"]);
    let line = folded.stdout.lines().next().unwrap_or_default().to_string();
    assert_eq!(folded.stdout.lines().count(), 1, "{}", folded.stdout);
    assert!(
        line.ends_with(";memtrace_workload::brk::grow_heap_with_raw_brk_[memtrace-workload] 41"),
        "{line}"
    );
}

#[test]
fn each_interval_is_a_report_and_sum_adds_them() {
    let d = scratch("intervals");
    // The loop, then a linger over a few more intervals.
    let live = record(&d, "i.rec", &w("rawbrk 40 4096 700"), &["-i", "200ms"]);
    let rep = mt(&d, &["report", "i.rec"]);
    assert_eq!(rep.stdout, live.stdout);
    let info = mt(&d, &["report", "--info", "i.rec"]);
    let reports: usize = info
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("reports"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{}", info.stdout));
    assert!(reports >= 3, "{}", info.stdout);
    let sum = mt(&d, &["report", "--sum", "--json", "i.rec"]);
    let top = find(
        &json_of(&sum.stdout, "brk_stack"),
        "grow_heap_with_raw_brk",
        "main",
    )
    .clone();
    assert_eq!(top["count"], 41, "{}", sum.stdout);
}

#[test]
fn memleak_records_what_is_outstanding() {
    let d = scratch("memleak");
    // 10 blocks of 100 bytes and 2 of 1 MiB left allocated (tests/memleak/).
    let cmd = w("leak 10 100 2 1048576 100 0");
    let live = mt(
        &d,
        &[
            "memleak", "--json", "--top", "50", "-c", &cmd, "--record", "m.rec",
        ],
    );
    assert_eq!(live.code, 0, "{}", live.stderr);
    let rep = mt(&d, &["report", "--json", "m.rec"]);
    let stacks = json_of(&rep.stdout, "memleak");
    assert_eq!(stacks, json_of(&live.stdout, "memleak"));
    let small = find(&stacks, "leak_small_blocks", "leak");
    assert_eq!(
        (small["count"].as_u64(), small["bytes"].as_u64()),
        (Some(10), Some(1000))
    );
    let text = mt(&d, &["memleak", "-c", &cmd, "--record", "t.rec"]);
    assert_eq!(mt(&d, &["report", "t.rec"]).stdout, text.stdout);
}

#[test]
fn the_record_names_its_run_and_the_build_ids_of_its_modules() {
    let d = scratch("info");
    record(&d, "a.rec", &w("rawbrk 4 4096"), &[]);
    let info = mt(&d, &["report", "--info", "a.rec"]);
    assert_eq!(info.code, 0, "{}", info.stderr);
    assert!(
        info.stdout.contains("tool      brkstack\n"),
        "{}",
        info.stdout
    );
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(
        info.stdout
            .contains(&format!("kernel    {}\n", release.trim())),
        "{}",
        info.stdout
    );
    // The workload's build id as binutils reads it, where they are installed.
    let Ok(notes) = Command::new("readelf")
        .arg("-n")
        .arg(workload_bin())
        .output()
    else {
        skip("record build id check", "no readelf");
        return;
    };
    let notes = String::from_utf8_lossy(&notes.stdout);
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("the workload has a build id");
    assert!(
        info.stdout
            .contains(&format!("build id  {id}  memtrace-workload\n")),
        "{}",
        info.stdout
    );
    // And libc's, which the stacks go through: memtrace maps it too, and
    // opened it before the record, which once left it out.
    let libc = std::path::Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let notes = Command::new("readelf")
        .arg("-n")
        .arg(libc)
        .output()
        .unwrap();
    let notes = String::from_utf8_lossy(&notes.stdout);
    if let Some(id) = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
    {
        assert!(
            info.stdout
                .contains(&format!("build id  {id}  libc.so.6\n")),
            "{}",
            info.stdout
        );
    }
}

#[test]
fn a_record_cut_short_reads_to_its_last_whole_item_and_says_so() {
    let d = scratch("truncated");
    record(&d, "t.rec", &w("rawbrk 40 4096"), &[]);
    let whole = std::fs::read(d.join("t.rec")).unwrap();
    // The items after the header are one gzip stream.
    let body = header_end(&whole);
    assert_eq!(whole[body..body + 2], [0x1f, 0x8b], "items not compressed");
    // The trailer is the last item: cut into it, wherever its bytes are
    // in the stream. Each cut reads whole (the stream's own end cut) or
    // to the report before it, and says so.
    let mut cut_in_trailer = 0;
    for cut in 1..120.min(whole.len() - body) {
        std::fs::write(d.join("cut.rec"), &whole[..whole.len() - cut]).unwrap();
        let rep = mt(&d, &["report", "cut.rec"]);
        assert_eq!(rep.code, 0, "cut {cut}: {}", rep.stderr);
        if rep.stderr.contains("truncated") {
            assert!(
                rep.stderr.contains("cut.rec: truncated after 1 records"),
                "cut {cut}: {}",
                rep.stderr
            );
            cut_in_trailer += 1;
        }
        assert!(
            rep.stdout.contains("grow_heap_with_raw_brk"),
            "cut {cut}: {}",
            rep.stdout
        );
        if cut_in_trailer >= 3 {
            break;
        }
    }
    assert!(cut_in_trailer > 0, "no cut fell in the trailer");
    let ok = mt(&d, &["report", "t.rec"]);
    assert!(!ok.stderr.contains("truncated"), "{}", ok.stderr);
    // A byte changed inside the report item (the middle of the file, the
    // trailer after it): an error saying where, exit 1, not a cut.
    let mut bad = whole.clone();
    let mid = body + (whole.len() - body) / 2;
    bad[mid] ^= 0x20;
    std::fs::write(d.join("bad.rec"), &bad).unwrap();
    let rep = mt(&d, &["report", "bad.rec"]);
    assert_eq!(rep.code, 1, "{}", rep.stderr);
    assert_eq!(rep.stderr.trim().lines().count(), 1, "{}", rep.stderr);
    assert!(rep.stderr.contains("bad.rec: the "), "{}", rep.stderr);
    assert!(rep.stderr.contains("damaged"), "{}", rep.stderr);
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let d = scratch("bad");
    std::fs::write(d.join("text.rec"), "hello\n").unwrap();
    record(&d, "a.rec", &w("rawbrk 4 4096"), &[]);
    let f = mt(
        &d,
        &[
            "faults",
            "--stacks",
            "-c",
            &w("touch 10"),
            "--record",
            "f.rec",
        ],
    );
    assert_eq!(f.code, 0, "{}", f.stderr);
    for (args, says) in [
        (
            vec!["diff", "a.rec", "f.rec"],
            "a.rec is a brkstack record and f.rec a faults record",
        ),
        (vec!["report", "missing.rec"], "cannot open missing.rec"),
        (
            vec!["report", "text.rec"],
            "text.rec is not a memtrace record file",
        ),
        (
            vec!["diff", "a.rec", "text.rec"],
            "text.rec is not a memtrace record file",
        ),
        (
            vec!["annotate", "add", "a.rec", "ffffffffffff", "--note", "x"],
            "no stack ffffffffffff in a.rec",
        ),
    ] {
        let out = mt(&d, &args);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert_eq!(out.stderr.lines().count(), 1, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
        assert!(out.stdout.is_empty(), "{args:?}: {}", out.stdout);
    }
}

/// A flame graph that cannot be written: to a full device it is a failure
/// at run time (exit 1, as the README says of output), to a directory that
/// does not exist bad input (exit 2); one line each.
#[test]
fn svg_write_failures_exit_as_the_readme_says() {
    let d = scratch("svgfail");
    record(&d, "t.rec", &w("rawbrk 10 4096"), &[]);
    for (to, code) in [("/dev/full", 1), ("/nonexistent-dir/x.svg", 2)] {
        let out = mt(&d, &["report", "t.rec", "--svg", to]);
        assert_eq!(out.code, code, "{to}: {}", out.stderr);
        assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
        assert!(out.stderr.contains("cannot write"), "{}", out.stderr);
    }
}

/// Where a record's items start: past the magic and the header.
fn header_end(rec: &[u8]) -> usize {
    let mut cur = std::io::Cursor::new(&rec[3..]);
    let _: ciborium::Value = ciborium::from_reader(&mut cur).unwrap();
    3 + cur.position() as usize
}

/// A CBOR head (RFC 8949 3.1), for framing a hand-made item.
fn cbor_head(major: u8, v: u64, out: &mut Vec<u8>) {
    out.push(major << 5 | 27);
    out.extend(v.to_be_bytes());
}

/// A record whose one report is a million empty frames (4 bytes each in
/// the file, about a hundred in memory): refused with one line and exit
/// 1, in bounded memory (it took 779 MiB for 62 MB before it was bounded).
#[test]
fn a_record_of_tiny_items_is_refused_in_bounded_memory() {
    use ciborium::Value as V;
    let d = scratch("hostile");
    record(&d, "t.rec", &w("rawbrk 4 4096"), &[]);
    let real = std::fs::read(d.join("t.rec")).unwrap();
    // The magic and header of a real record, then the hostile item
    // (compressed, as the items are).
    let mut file = real[..header_end(&real)].to_vec();
    let t = |s: &str| V::Text(s.into());
    let frame = V::Map(vec![(t("f"), t(""))]);
    let stack = V::Map(vec![
        (t("pid"), V::Integer(1.into())),
        (t("comm"), t("x")),
        (t("count"), V::Integer(1.into())),
        (t("processes"), V::Integer(1.into())),
        (t("kernel"), V::Array(vec![])),
        (t("user"), V::Array(vec![frame; 1_000_000])),
    ]);
    let report = V::Map(vec![
        (t("type"), t("report")),
        (t("seq"), V::Integer(0.into())),
        (t("at"), V::Float(0.0)),
        (t("kind"), t("brkstack")),
        (t("title"), t("t")),
        (t("stacks"), V::Array(vec![stack])),
    ]);
    let mut item = Vec::new();
    ciborium::into_writer(&report, &mut item).unwrap();
    let mut framed = vec![0x82];
    cbor_head(0, crc32fast::hash(&item) as u64, &mut framed);
    cbor_head(2, item.len() as u64, &mut framed);
    framed.extend(&item);
    // The allowance counts the bytes as they come out of the stream.
    let mb = framed.len() as f64 / (1 << 20) as f64;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &framed).unwrap();
    file.extend(gz.finish().unwrap());
    std::fs::write(d.join("h.rec"), &file).unwrap();
    let rep = mt(&d, &["report", "h.rec"]);
    assert_eq!(rep.code, 1, "{}", rep.stderr);
    assert_eq!(rep.stderr.trim().lines().count(), 1, "{}", rep.stderr);
    assert!(rep.stderr.contains("per byte of file"), "{}", rep.stderr);
    // The largest child so far (memtrace runs of a few MiB each): the
    // allowance is 16 bytes a byte of file and 16 MiB, twice that with
    // the slack of growing lists.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let peak_mb = ru.ru_maxrss as f64 / 1024.0;
    assert!(
        peak_mb < 2.0 * (16.0 * mb + 16.0) + 30.0,
        "{peak_mb:.0} MiB for a {mb:.1} MB file"
    );
    // Big enough to mean something: at 96 bytes a frame in memory, past
    // the allowance with room to spare.
    assert!(mb > 3.5, "{mb}");
}
