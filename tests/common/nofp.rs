//! The workloads built without frame pointers (tests/workload/nofp/), built
//! here once per test binary: a C one (cc), a Rust one (plain rustc) and a
//! C library to dlopen.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::{json_of, run, status_within};

pub fn src(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("workload/nofp")
        .join(name)
}

/// Builds into a directory of this test binary's own: binaries run side by
/// side, and one rebuilding a file that another's workload is running from
/// would change it under the memtrace reading it.
pub fn build(out: &str, cmd: &mut Command) -> PathBuf {
    let me = std::env::current_exe().expect("the test binary's own path");
    let stem = me.file_stem().and_then(|s| s.to_str()).unwrap_or("tests");
    // Without cargo's hash: one directory per test binary across builds.
    let name = stem.rsplit_once('-').map_or(stem, |(n, _)| n);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).expect("creating the test binary's build directory");
    let path = dir.join(out);
    let st = status_within(
        cmd.arg("-o").arg(&path),
        std::time::Duration::from_secs(300),
    );
    assert!(st.success(), "building {out} failed");
    path
}

/// The C workload: sbrk and page touches three named functions deep.
pub fn c_workload() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        build(
            "nofp-c",
            Command::new("cc")
                .args([
                    "-O2",
                    "-g",
                    "-fomit-frame-pointer",
                    "-fno-optimize-sibling-calls",
                ])
                .arg(src("nofp.c")),
        )
    })
}

pub fn rust_workload() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        build(
            "nofp-rs",
            Command::new("rustc")
                .args([
                    "--edition",
                    "2021",
                    "-O",
                    "-g",
                    "-C",
                    "force-frame-pointers=no",
                ])
                .arg(src("nofp.rs")),
        )
    })
}

/// lib.c as a shared library, for `nofp-c dlopen`.
pub fn c_library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        build(
            "libnofp.so",
            Command::new("cc")
                .args([
                    "-O2",
                    "-g",
                    "-shared",
                    "-fPIC",
                    "-fomit-frame-pointer",
                    "-fno-optimize-sibling-calls",
                ])
                .arg(src("lib.c")),
        )
    })
}

/// Runs memtrace, which must succeed: its stdout and JSON summary.
pub fn trace(args: &[&str]) -> (String, serde_json::Value) {
    let out = run(args);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let summary = json_of(&out.stdout, "summary").pop().expect("a summary");
    (out.stdout, summary)
}

/// memtrace `tool` with `extra`, stacks unwound with DWARF by `unwinder`
/// (`kernel` or `copy`), on `cmd`; it must succeed: stdout and summary.
pub fn dwarf(tool: &str, extra: &[&str], unwinder: &str, cmd: &str) -> (String, serde_json::Value) {
    let mut args = vec![tool];
    args.extend_from_slice(extra);
    args.extend([
        "--stack-mode",
        "dwarf",
        "--unwinder",
        unwinder,
        "--json",
        "-c",
        cmd,
    ]);
    trace(&args)
}

/// The stacks of `ty` whose frames include `f`.
pub fn through(stdout: &str, ty: &str, f: &str) -> Vec<serde_json::Value> {
    json_of(stdout, ty)
        .into_iter()
        .filter(|s| at(&super::user_frames(s), f).is_some())
        .collect()
}

pub fn sum(stacks: &[serde_json::Value], field: &str) -> u64 {
    stacks.iter().map(|s| s[field].as_u64().unwrap()).sum()
}

/// The C workload's sbrk loop, innermost first: through glibc's sbrk
/// (built without frame pointers) to main.
pub const C_SBRK: [&str; 6] = [
    "__brk",
    "sbrk",
    "heap_grow_inner",
    "heap_grow_middle",
    "heap_grow_outer",
    "main",
];

/// The C workload's page loop, innermost first, to main.
pub const C_TOUCH: [&str; 4] = [
    "pages_touch_inner",
    "pages_touch_middle",
    "pages_touch_outer",
    "main",
];

/// Index of the first frame naming `f`.
pub fn at(frames: &[String], f: &str) -> Option<usize> {
    frames.iter().position(|x| x.contains(f))
}

/// Asserts `names` appear in `frames` in this order, innermost first.
pub fn assert_in_order(frames: &[String], names: &[&str]) {
    let idx: Vec<Option<usize>> = names.iter().map(|n| at(frames, n)).collect();
    assert!(
        idx.iter().all(|i| i.is_some()),
        "{names:?} not all in {frames:#?}"
    );
    assert!(
        idx.windows(2).all(|w| w[0] < w[1]),
        "{names:?} out of order in {frames:#?}"
    );
}
