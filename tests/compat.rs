//! The object for kernels without bpf_loop or attach cookies (5.10),
//! tried here with `MEMTRACE_OBJECT=compat`: the 6.18 verifier checks the
//! same programs, and the ways those kernels take give exact answers (user
//! stacks by the kernel's walker, a count program per tracepoint, a
//! memleak entry program per allocator shape). The 5.10 guest of the
//! kernel matrix (`MEMTRACE_KERNELS=5.10`) runs them on the kernel itself.

mod common;

use common::*;

fn compat(args: &[&str]) -> Output {
    // Only this test binary's runs: each test file is a process of its own.
    std::env::set_var("MEMTRACE_OBJECT", "compat");
    run(args)
}

fn workload(args: &str) -> String {
    format!("{} {args}", workload_bin().display())
}

#[test]
fn faults_stacks_by_the_kernels_walker_are_whole_and_exact() {
    let out = compat(&[
        "faults",
        "--stacks",
        "--json",
        "-c",
        &workload("touch 2000"),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("fp by the kernel's walker (this kernel has no bpf_loop"),
        "{}",
        out.stderr
    );
    let through: u64 = json_of(&out.stdout, "fault_stack")
        .iter()
        .filter(|s| {
            let f = user_frames(s);
            f.first().is_some_and(|f| f.contains("touch_fresh_pages"))
                && f.iter().any(|f| f.contains("main"))
        })
        .map(|s| s["count"].as_u64().unwrap())
        .sum();
    assert_eq!(through, 2000, "{}", out.stdout);
    // DWARF is refused there, in one line.
    let dwarf = compat(&["faults", "--stacks", "--stack-mode", "dwarf", "-c", "true"]);
    assert_eq!(dwarf.code, 2, "{}", dwarf.stderr);
    assert!(dwarf.stderr.contains("no bpf_loop"), "{}", dwarf.stderr);
}

#[test]
fn count_tells_tracepoints_apart_without_cookies() {
    let out = compat(&[
        "count",
        "--json",
        "-v",
        "syscalls:sys_enter_madvise",
        "syscalls:sys_enter_munmap",
        "-c",
        &workload("madvise 30 4096"),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "count");
    let of = |tp: &str| {
        rows.iter()
            .filter(|r| r["tracepoint"] == tp)
            .map(|r| r["count"].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(of("syscalls:sys_enter_madvise"), 30, "{}", out.stdout);
    assert!(of("syscalls:sys_enter_munmap") >= 1, "{}", out.stdout);
    // Each by the program for its place, not by the one reading a cookie.
    assert!(
        out.stderr.contains("sys_enter_munmap (program count_at1)"),
        "{}",
        out.stderr
    );
    // More than a program each can tell apart: one line, exit 2.
    let many = compat(&["count", "syscalls:sys_enter_m*", "-c", "true"]);
    assert_eq!(many.code, 2, "{}", many.stderr);
    assert!(many.stderr.contains("up to 8"), "{}", many.stderr);
}

#[test]
fn memleak_uprobes_hold_exactly_what_leaked_without_cookies() {
    let out = compat(&[
        "memleak",
        "--json",
        "--no-preload",
        "-c",
        &workload("leak 7 1000 3 1048576 200 0"),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "memleak");
    assert_eq!(
        held(&rows, "leak_small_blocks"),
        (7, 7000),
        "{}",
        out.stdout
    );
    assert_eq!(
        held(&rows, "leak_big_blocks"),
        (3, 3 << 20),
        "{}",
        out.stdout
    );
    assert_eq!(held(&rows, "churn"), (0, 0), "{}", out.stdout);
}
