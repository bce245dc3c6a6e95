//! `memtrace diff` and `annotate`, and what they rest on: stack ids that
//! stay the same across runs and rebuilds; flame graphs.

mod common;
#[path = "record/util.rs"]
mod util;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use util::*;

#[test]
fn a_stack_keeps_its_id_across_runs_and_frame_styles() {
    let d = scratch("ids");
    // Two processes, two address-space layouts; one shown by offsets.
    let a = record(&d, "a.rec", &w("rawbrk 10 4096"), &["--json"]);
    let b = record(
        &d,
        "b.rec",
        &w("rawbrk 20 4096"),
        &["--json", "--addresses"],
    );
    let sa = json_of(&a.stdout, "brk_stack");
    let sb = json_of(&b.stdout, "brk_stack");
    let (x, y) = (
        find(&sa, "grow_heap_with_raw_brk", "main"),
        find(&sb, "grow_heap_with_raw_brk", "main"),
    );
    assert_ne!(x["pid"], y["pid"]);
    assert!(user_frames(y)[0].contains("+0x"), "{y}");
    let id = x["stack_id"].as_str().expect("stack_id").to_string();
    assert_eq!(id.len(), 12);
    assert_eq!(y["stack_id"], id.as_str());
    // The text output shows it too.
    let t = record(&d, "c.rec", &w("rawbrk 10 4096"), &[]);
    assert!(t.stdout.contains(&format!(" stack {id}\n")), "{}", t.stdout);
}

#[test]
fn diff_shows_what_grew_and_what_appeared() {
    let d = scratch("diff");
    // One process each: the known stack, then it again with 20 more calls
    // and a new one below it.
    record(&d, "a.rec", &w("rawbrk 40 4096"), &[]);
    record(&d, "b.rec", &w("rawbrk-deep 60 3 5"), &[]);
    let out = mt(&d, &["diff", "--json", "a.rec", "b.rec"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let all = json_of(&out.stdout, "diff");
    let grew = find(&all, "grow_heap_with_raw_brk", "memtrace_workload::main");
    assert_eq!(grew["status"], "grew", "{}", out.stdout);
    assert_eq!(
        (grew["count_a"].as_u64(), grew["count_b"].as_u64()),
        (Some(41), Some(61))
    );
    assert_eq!(grew["delta"], 20);
    assert_eq!(grew["delta_bytes"], 20 * 4096);
    let new = find(&all, "grow_heap_with_raw_brk", "raw_brk_deep");
    assert_eq!(new["status"], "appeared");
    assert_eq!(
        (new["count_b"].as_u64(), new["delta_bytes"].as_i64()),
        (Some(6), Some(5 * 4096))
    );
    // Largest change first.
    let deltas: Vec<i64> = all
        .iter()
        .map(|c| c["delta"].as_i64().unwrap().abs())
        .collect();
    assert!(deltas.windows(2).all(|p| p[0] >= p[1]), "{deltas:?}");
    // Text: one line per change with its id.
    let text = mt(&d, &["diff", "a.rec", "b.rec"]);
    let id = grew["stack_id"].as_str().unwrap();
    assert!(
        text.stdout
            .lines()
            .any(|l| l.starts_with("grew") && l.contains("+20") && l.contains(id)),
        "{}",
        text.stdout
    );
}

/// A stack that vanished has no width in a differential flame graph of the
/// later run: the default draws it under its own root at the earlier run's
/// width, in the colour of a fall, and says so; `--reverse` (the earlier
/// run's widths) draws it in place.
#[test]
fn diff_draws_the_stacks_that_vanished() {
    let d = scratch("vanished");
    record(&d, "a.rec", &w("rawbrk-deep 60 3 5"), &[]);
    record(&d, "b.rec", &w("rawbrk 40 4096"), &[]);
    let plain = mt(&d, &["diff", "a.rec", "b.rec", "--svg", "plain.svg"]);
    assert_eq!(plain.code, 0, "{}", plain.stderr);
    assert!(
        plain
            .stderr
            .contains("stacks that vanished are drawn under"),
        "{}",
        plain.stderr
    );
    let svg = std::fs::read_to_string(d.join("plain.svg")).unwrap();
    assert_xml(&svg);
    assert!(
        svg.contains("[vanished: widths from the earlier run]"),
        "{svg}"
    );
    assert!(
        svg.contains("raw_brk_deep"),
        "the vanished stack is not drawn"
    );
    let rev = mt(
        &d,
        &["diff", "a.rec", "b.rec", "--svg", "rev.svg", "--reverse"],
    );
    assert_eq!(rev.code, 0, "{}", rev.stderr);
    let svg = std::fs::read_to_string(d.join("rev.svg")).unwrap();
    assert_xml(&svg);
    assert!(
        svg.contains("raw_brk_deep"),
        "the vanished stack is not drawn"
    );
}

/// Well-formed XML (every element closed in order).
fn assert_xml(svg: &str) {
    let mut r = quick_xml::Reader::from_str(svg);
    let mut elements = 0;
    loop {
        match r.read_event() {
            Ok(quick_xml::events::Event::Eof) => break,
            Ok(quick_xml::events::Event::Start(_)) => elements += 1,
            Ok(_) => {}
            Err(e) => panic!("not well-formed at {}: {e}", r.buffer_position()),
        }
    }
    assert!(elements > 3, "{svg}");
}

#[test]
fn flame_graphs_are_svg_with_the_workload_functions() {
    let d = scratch("svg");
    record(&d, "a.rec", &w("rawbrk 40 4096"), &[]);
    record(&d, "b.rec", &w("deepbrk 3 5"), &[]);
    let rep = mt(&d, &["report", "a.rec", "--svg", "a.svg"]);
    assert_eq!(rep.code, 0, "{}", rep.stderr);
    let svg = std::fs::read_to_string(d.join("a.svg")).unwrap();
    assert_xml(&svg);
    assert!(svg.contains("<svg"), "{svg}");
    assert!(svg.contains("grow_heap_with_raw_brk"));
    let diff = mt(&d, &["diff", "a.rec", "b.rec", "--svg", "d.svg"]);
    assert_eq!(diff.code, 0, "{}", diff.stderr);
    let svg = std::fs::read_to_string(d.join("d.svg")).unwrap();
    assert_xml(&svg);
    assert!(svg.contains("raw_brk_deep"));
}

#[test]
fn annotations_show_in_report_and_diff_and_the_rest_is_new() {
    let d = scratch("annotate");
    let live = record(&d, "a.rec", &w("rawbrk 40 4096"), &["--json"]);
    record(&d, "b.rec", &w("rawbrk 50 4096"), &[]);
    let stacks = json_of(&live.stdout, "brk_stack");
    let id = find(&stacks, "grow_heap_with_raw_brk", "main")["stack_id"]
        .as_str()
        .unwrap()
        .to_string();
    // No database yet: nothing is flagged.
    assert!(!mt(&d, &["report", "a.rec"]).stdout.contains("[new]"));
    let add = mt(
        &d,
        &[
            "annotate",
            "add",
            "a.rec",
            &id[..8],
            "--note",
            "the test loop",
            "--verdict",
            "bug",
        ],
    );
    assert_eq!(add.code, 0, "{}", add.stderr);
    let db = std::fs::read_to_string(d.join("memtrace-annotations.txt")).unwrap();
    assert!(db.contains(&format!("{id}  bug  the test loop\n")), "{db}");
    let list = mt(&d, &["annotate", "list"]);
    assert!(
        list.stdout.starts_with(&format!("{id}  bug")),
        "{}",
        list.stdout
    );

    let rep = mt(&d, &["report", "a.rec"]);
    let lines: Vec<&str> = rep.stdout.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.ends_with(&format!(" stack {id}")))
        .expect("annotated stack");
    // The annotation closes the stack's frames, where notes go.
    assert_eq!(lines[at - 1], "    [bug: the test loop]", "{}", rep.stdout);
    assert!(rep.stdout.contains("    [new]\n"), "{}", rep.stdout);
    let json = mt(&d, &["report", "--json", "a.rec"]);
    let s = json_of(&json.stdout, "brk_stack");
    assert_eq!(
        find(&s, "grow_heap_with_raw_brk", "main")["note"],
        "bug: the test loop"
    );

    // Found through the environment from elsewhere, applied by diff.
    let other = scratch("annotate-elsewhere");
    let diff = Command::new(memtrace_bin())
        .args(["diff", "--json"])
        .args([d.join("a.rec"), d.join("b.rec")])
        .current_dir(&other)
        .env("MEMTRACE_ANNOTATIONS", d.join("memtrace-annotations.txt"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&diff.stdout);
    let all = json_of(&out, "diff");
    let c = all
        .iter()
        .find(|c| c["stack_id"] == id.as_str())
        .expect("in diff");
    assert_eq!(
        (c["annotation"].as_str(), c["delta"].as_i64()),
        (Some("bug: the test loop"), Some(10))
    );

    // `ignore` hides the stack, unless --all.
    mt(
        &d,
        &[
            "annotate",
            "add",
            "a.rec",
            &id,
            "--note",
            "",
            "--verdict",
            "ignore",
        ],
    );
    assert!(!mt(&d, &["report", "a.rec"]).stdout.contains(&id));
    assert!(mt(&d, &["report", "--all", "a.rec"]).stdout.contains(&id));
}

/// nofp.c (tests/workload/nofp) built into `dir` as `nofp-c`, functions
/// aligned to `align` bytes; None without a C compiler.
fn build_c(dir: &Path, align: &str) -> Option<PathBuf> {
    std::fs::create_dir_all(dir).unwrap();
    let out = dir.join("nofp-c");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("workload/nofp/nofp.c");
    let st = Command::new("cc")
        .args(["-O2", "-g", "-fno-optimize-sibling-calls"])
        .arg(format!("-falign-functions={align}"))
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status()
        .ok()?;
    st.success().then_some(out)
}

/// The address of `sym` in `bin`, as nm reads it.
fn address_of(bin: &Path, sym: &str) -> Option<String> {
    let out = Command::new("nm").arg(bin).output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.ends_with(&format!(" {sym}")))
        .map(|l| l.split(' ').next().unwrap_or_default().to_string())
}

#[test]
fn a_stack_keeps_its_id_across_a_rebuild_that_moves_its_code() {
    let d = scratch("rebuild");
    let (Some(a), Some(b)) = (build_c(&d.join("a"), "1"), build_c(&d.join("b"), "256")) else {
        skip("rebuild ids", "no C compiler (cc)");
        return;
    };
    if let (Some(x), Some(y)) = (
        address_of(&a, "heap_grow_inner"),
        address_of(&b, "heap_grow_inner"),
    ) {
        assert_ne!(x, y, "the rebuild did not move the code");
    }
    let id = |bin: &Path, file: &str| -> String {
        let cmd = format!("{} sbrk 20", bin.display());
        let out = record(&d, file, &cmd, &["--json", "--stack-mode", "dwarf"]);
        let stacks = json_of(&out.stdout, "brk_stack");
        let s = stacks
            .iter()
            .filter(|s| user_frames(s).iter().any(|f| f.contains("heap_grow_inner")))
            .max_by_key(|s| s["count"].as_u64())
            .unwrap_or_else(|| panic!("no heap_grow_inner stack: {}", out.stdout));
        assert!(s["count"].as_u64() >= Some(19), "{s}");
        s["stack_id"].as_str().unwrap().to_string()
    };
    assert_eq!(id(&a, "a.rec"), id(&b, "b.rec"));
}
