//! Go programs (built here with the host's Go toolchain, Debian's
//! `golang-go`): whole stacks by default, though Go writes no `.eh_frame`
//! for its code, and a stripped binary walked by its frame pointers.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::nofp::{at, sum, trace};
use common::*;

const TEST: &str = "golang";

/// The Go workload built with `ldflags` (None: no Go toolchain here).
fn go_build(out: &str, ldflags: &str) -> Option<PathBuf> {
    if !installed("go", "version") {
        return None;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("workload/go/hoard.go");
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = tmp.join(TEST);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(out);
    let cache = tmp.join("go-cache");
    // Go takes its flags before the file: not nofp's `build`.
    let st = status_within(
        Command::new("go")
            .args(["build", "-ldflags", ldflags, "-o"])
            .arg(&path)
            .arg(src)
            .env("GOCACHE", &cache)
            .env("GOPATH", cache.join("path"))
            .env("GO111MODULE", "off")
            .env("CGO_ENABLED", "0")
            .current_dir(tmp),
        std::time::Duration::from_secs(300),
    );
    assert!(st.success(), "building {out} failed");
    Some(path)
}

fn hoard() -> Option<&'static Path> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| go_build("go-hoard", "")).as_deref()
}

fn hoard_stripped() -> Option<&'static Path> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| go_build("go-hoard-stripped", "-s -w"))
        .as_deref()
}

/// The fault stacks of a default `faults --stacks` run of `bin`, and the
/// summary.
fn fault_stacks(bin: &Path) -> (Vec<serde_json::Value>, serde_json::Value) {
    let cmd = format!("{} 1000", bin.display());
    let (out, summary) = trace(&["faults", "--stacks", "--json", "-c", &cmd]);
    (json_of(&out, "fault_stack"), summary)
}

/// A stack with no mark of an early stop.
fn whole(s: &serde_json::Value) -> bool {
    user_frames(s).iter().all(|f| !f.starts_with('[')) && s["note"].is_null()
}

/// Asserts that at least 95% of the faults `bin`'s hoard() took have a
/// whole stack through main.main and runtime.main to the goroutine's start.
fn whole_through_main(bin: &Path) {
    let (stacks, summary) = fault_stacks(bin);
    let hoarding: Vec<_> = stacks
        .iter()
        .filter(|s| {
            user_frames(s)
                .first()
                .is_some_and(|f| f.contains("main.hoard"))
        })
        .cloned()
        .collect();
    let n = sum(&hoarding, "count");
    // One fault per page at most, 16 pages a block: fewer where the
    // kernel maps a huge page at once.
    assert!(n > 0 && n <= 16_000, "{n} faults in main.hoard: {summary}");
    let through: Vec<_> = hoarding
        .iter()
        .filter(|s| {
            let f = user_frames(s);
            let main = at(&f, "main.main");
            whole(s) && main.is_some_and(|m| at(&f, "runtime.main").is_some_and(|r| m < r))
        })
        .cloned()
        .collect();
    let whole_n = sum(&through, "count");
    assert!(
        whole_n * 100 >= n * 95,
        "{whole_n} of {n} faults in main.hoard have a whole stack through main.main and runtime.main: {hoarding:#?}"
    );
    // The walk ends at the goroutine's first frame, complete.
    for s in &through {
        let f = user_frames(s);
        assert!(f.last().unwrap().contains("runtime.goexit"), "{f:#?}");
    }
}

#[test]
fn go_fault_stacks_are_whole_by_default() {
    let Some(bin) = hoard() else {
        return skip(TEST, "no Go toolchain (golang-go)");
    };
    whole_through_main(bin);
}

/// `-ldflags=-s -w`: no symbols and no `.debug_frame`. Walked by frame
/// pointers, named from the runtime's own function table, and the choice
/// said for the binary in -v.
#[test]
fn a_stripped_go_binary_is_walked_by_frame_pointers_and_named() {
    let Some(bin) = hoard_stripped() else {
        return skip(TEST, "no Go toolchain (golang-go)");
    };
    whole_through_main(bin);
    let cmd = format!("{} 10", bin.display());
    let out = run(&["faults", "--stacks", "-v", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let name = bin.display().to_string();
    let said: Vec<_> = out
        .stderr
        .lines()
        .filter(|l| l.contains(&format!("{name}:")) && l.contains("frame pointers"))
        .collect();
    assert_eq!(said.len(), 1, "{}", out.stderr);
}
