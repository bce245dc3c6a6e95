//! `memtrace memleak` on a program linked with an allocator of its own (as
//! redis-server is with jemalloc): with `-c` the preloaded shim hands its
//! calls to that allocator, not glibc's; with `-p` the probes go into that
//! allocator, not libc's. Both report its leaks exactly.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const K: u64 = 9;
const SIZE: u64 = 3000;
const N: u64 = 500;

fn src(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/workload/ownalloc")
        .join(name)
}

fn cc(args: &[&str], out: &Path) {
    let st = status_within(
        Command::new("cc").args(args).arg("-o").arg(out),
        std::time::Duration::from_secs(120),
    );
    assert!(st.success(), "building {} failed", out.display());
}

/// The allocator library and the program linked with it.
fn own_allocator_program() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let lib = dir.join("libownalloc.so");
    cc(
        &[
            "-shared",
            "-fPIC",
            "-O2",
            src("ownalloc.c").to_str().unwrap(),
        ],
        &lib,
    );
    let prog = dir.join("ownprog");
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    cc(
        &[
            "-O2",
            "-fno-omit-frame-pointer",
            src("ownprog.c").to_str().unwrap(),
            &format!("-L{}", dir.display()),
            "-lownalloc",
            &rpath,
        ],
        &prog,
    );
    prog
}

/// Outstanding (allocations, bytes) of the stacks through `f`.
fn held(stdout: &str, f: &str) -> (u64, u64) {
    json_of(stdout, "memleak")
        .iter()
        .filter(|r| user_frames(r).iter().any(|x| x.starts_with(f)))
        .fold((0, 0), |(n, b), r| {
            (
                n + r["count"].as_u64().unwrap(),
                b + r["bytes"].as_u64().unwrap(),
            )
        })
}

/// K blocks of SIZE held from leak_here, nothing from churn.
fn assert_exact(stdout: &str) {
    assert_eq!(held(stdout, "leak_here"), (K, K * SIZE), "{stdout}");
    assert_eq!(held(stdout, "churn"), (0, 0), "{stdout}");
}

#[test]
fn a_running_program_s_own_allocator_is_the_one_probed() {
    let prog = own_allocator_program();
    let (k, size, n) = (K.to_string(), SIZE.to_string(), N.to_string());
    let mut w = Workload::start_from(prog.as_os_str(), &[&k, &size, &n], |_| {});
    let pid = w.pid.to_string();
    let t = Tracer::start(&["memleak", "-v", "--json", "--top", "50", "-p", &pid]);
    w.go();
    assert!(w.wait().success());
    let out = t.wait(std::time::Duration::from_secs(20));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("libownalloc.so, whose malloc it calls"),
        "{}",
        out.stderr
    );
    assert_exact(&out.stdout);
}

#[test]
fn a_program_with_its_own_allocator_keeps_it_under_the_shim() {
    let prog = own_allocator_program();
    let cmd = format!("{} {K} {SIZE} {N}", prog.display());
    let out = run(&["memleak", "-v", "--json", "--top", "50", "-c", &cmd]);
    // The shim used to call glibc's malloc: the allocator's own
    // malloc_usable_size then met a block that was not its and aborted.
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains("allocations (preloaded shim): attached uprobe"),
        "{}",
        out.stderr
    );
    // Its allocator served every block: K, and N mallocs and N reallocs.
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("ownalloc_served "))
        .unwrap_or_else(|| panic!("no line from the program: {}", out.stdout));
    let served: u64 = line.split(' ').nth(1).unwrap().parse().unwrap();
    assert!(served >= K + 2 * N, "{line}");
    assert!(line.ends_with(&format!("usable {}", K * SIZE)), "{line}");
    assert_exact(&out.stdout);
    let summary = &json_of(&out.stdout, "summary")[0];
    assert_eq!(summary["lost"]["map_full"], 0, "{summary}");
}
