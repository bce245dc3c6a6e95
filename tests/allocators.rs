//! `memtrace memleak` on a program linked with an allocator of its own (as
//! redis-server is with jemalloc): with `-c` the preloaded shim hands its
//! calls to that allocator, not glibc's; with `-p` the probes go into that
//! allocator, not libc's. Both report its leaks exactly. And the ways a
//! program reaches past a preload (dlsym in a library's handle, exec with
//! an environment of its own) still reach the shim.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const K: u64 = 9;
const SIZE: u64 = 3000;
const N: u64 = 500;

fn src(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("workload/ownalloc")
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

/// `LD_PRELOAD=lib prog` in the command line replaces the shim's
/// LD_PRELOAD for prog: the shim in the shell puts itself back first, and
/// forwards to the preloaded allocator. Before, prog ran without the shim
/// and its leaks were not seen at all.
#[test]
fn the_command_s_own_ld_preload_runs_beside_the_shim() {
    let prog = own_allocator_program();
    let lib = prog.with_file_name("libownalloc.so");
    let cmd = format!(
        "LD_PRELOAD={} {} {K} {SIZE} {N}",
        lib.display(),
        prog.display()
    );
    let out = run(&["memleak", "--json", "--top", "50", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert_exact(&out.stdout);
}

/// `env LD_PRELOAD=lib prog`: env sets the variable, then execvp's with its
/// own environment, which the shim's execvp hands to its execvpe: the shim
/// goes back first there too (before, env's exec went past the shim and
/// prog was not seen).
#[test]
fn env_s_own_ld_preload_runs_beside_the_shim() {
    let prog = own_allocator_program();
    let lib = prog.with_file_name("libownalloc.so");
    let cmd = format!(
        "env LD_PRELOAD={} {} {K} {SIZE} {N}",
        lib.display(),
        prog.display()
    );
    let out = run(&["memleak", "--json", "--top", "50", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert_exact(&out.stdout);
}

/// Python's ctypes finds malloc with dlsym in libc's own handle, past the
/// preload: the shim's dlsym hands it the shim's malloc. 2,000 blocks of
/// 3,000 bytes, half freed, the rest held when python ends (os._exit).
#[test]
fn ctypes_calls_to_libc_s_malloc_are_seen_through_the_shim() {
    let py = "/usr/bin/python3";
    if !Path::new(py).exists() {
        return skip(
            "ctypes_calls_to_libc_s_malloc_are_seen_through_the_shim",
            "no /usr/bin/python3",
        );
    }
    let code = "import ctypes, os; libc = ctypes.CDLL('libc.so.6'); \
                libc.malloc.restype = ctypes.c_void_p; libc.free.argtypes = [ctypes.c_void_p]; \
                ps = [libc.malloc(3000) for _ in range(2000)]; \
                [libc.free(p) for p in ps[:1000]]; os._exit(0)";
    let cmd = format!("{py} -c \"{code}\"");
    let out = run(&["memleak", "--json", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    // Called from libffi's ffi_call on ctypes' behalf.
    assert_eq!(
        held(&out.stdout, "ffi_call"),
        (1000, 3_000_000),
        "{}",
        out.stdout
    );
}

/// With the defaults (complete stacks, every call), a program holding
/// blocks from 20,000 call paths: more stacks than the 16,384 memleak once
/// kept (11,418 of 81,000 calls of a python3 started through pyenv's
/// shell shims were lost as map_full), and no call is lost now.
#[test]
fn many_call_paths_with_the_defaults_lose_no_call_to_a_full_stack_table() {
    let prog = Path::new(env!("CARGO_TARGET_TMPDIR")).join("many-stacks");
    cc(&["-O0", src("stacks.c").to_str().unwrap()], &prog);
    let summary = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["memleak", "--json", "-c", prog.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = run(&args);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let line = out
            .stdout
            .lines()
            .find(|l| l.contains("\"summary\""))
            .unwrap_or_else(|| panic!("no summary: {}", out.stderr))
            .to_string();
        serde_json::from_str(&line).unwrap()
    };
    // The old table's size: this program needs more.
    let small = summary(&["--max-stacks", "16384"]);
    assert!(small["lost"]["map_full"].as_u64().unwrap() > 0, "{small}");
    let v = summary(&[]);
    assert!(v["allocations"].as_u64().unwrap() >= 20_000, "{v}");
    assert_eq!(v["lost_total"], 0, "{v}");
}

/// The shim's dlsym passes RTLD_NEXT lookups on as a tail call, so glibc
/// still resolves them from the program's place, not the shim's.
#[test]
fn rtld_next_from_the_program_is_resolved_from_the_program() {
    let prog = Path::new(env!("CARGO_TARGET_TMPDIR")).join("rtld-next");
    cc(&["-O2", src("next.c").to_str().unwrap()], &prog);
    let out = run(&["memleak", "-c", prog.to_str().unwrap()]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("rtld-next same"), "{}", out.stdout);
}

/// The C++ leak workload linked with jemalloc, built as `name`; None (with
/// a skip of `test`) without jemalloc or a C++ compiler.
fn cxx_with_jemalloc(test: &str, name: &str) -> Option<PathBuf> {
    let je = Path::new("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2");
    if !je.exists() || !installed("c++", "--version") {
        skip(
            test,
            "needs libjemalloc.so.2 (apt libjemalloc2) and a C++ compiler",
        );
        return None;
    }
    let prog = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let st = status_within(
        Command::new("c++")
            .args(["-O2", "-g"])
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("workload/nofp/leak.cpp"))
            .arg(je)
            .arg("-o")
            .arg(&prog),
        std::time::Duration::from_secs(120),
    );
    assert!(st.success(), "building {} failed", prog.display());
    Some(prog)
}

/// C++ `new` on a program linked with jemalloc, which defines operator new
/// and delete itself and serves them without calling its malloc: under
/// `-c` the shim's operator new takes them, under `-p` jemalloc's are
/// probed. Both see every block, with the calling function in the stack.
#[test]
fn cpp_new_served_by_jemalloc_is_seen_with_and_without_the_shim() {
    let Some(prog) = cxx_with_jemalloc(
        "cpp_new_served_by_jemalloc_is_seen_with_and_without_the_shim",
        "cxx-jemalloc",
    ) else {
        return;
    };
    const NEW: u64 = 300;
    // Blob is 200 bytes.
    let want = (NEW, NEW * 200);
    let cmd = format!("{} {NEW}", prog.display());
    let out = run(&["memleak", "--json", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(held(&out.stdout, "cpp_leak_inner"), want, "{}", out.stdout);
    let args = [NEW.to_string()];
    // The shim loaded into the process, then uprobes on jemalloc's own.
    let out = by_pid(&prog, &args, &[]);
    assert!(
        out.stderr
            .contains("libjemalloc.so.2, through the shim loaded"),
        "{}",
        out.stderr
    );
    assert_eq!(held(&out.stdout, "cpp_leak_inner"), want, "{}", out.stdout);
    let out = by_pid(&prog, &args, &["--no-inject"]);
    assert!(out.stderr.contains("_Znwm"), "{}", out.stderr);
    assert_eq!(held(&out.stdout, "cpp_leak_inner"), want, "{}", out.stdout);
}

/// memleak `-p` of `prog ARGS` (which waits 1.5 s before its first call,
/// its libraries mapped by 400 ms), to its end.
fn by_pid(prog: &Path, args: &[String], extra: &[&str]) -> Output {
    let mut p = Paused::start(Command::new(prog).args(args));
    let pid = p.pid();
    let mut argv = vec!["memleak", "-v", "--json", "-p", &pid];
    argv.extend_from_slice(extra);
    let t = Tracer::start(&argv);
    p.go();
    assert!(wait_child(&mut p.child, std::time::Duration::from_secs(30)).success());
    let out = t.wait(std::time::Duration::from_secs(30));
    assert_eq!(out.code, 0, "{}", out.stderr);
    out
}

/// jemalloc's own API (mallocx, rallocx, xallocx, dallocx, sdallocx) on a
/// program linked with jemalloc: under `-c` the shim's versions take the
/// calls, under `-p` jemalloc's are probed. Both hold exactly the blocks
/// the program kept, in the function that made them.
#[test]
fn jemalloc_s_own_api_is_seen_with_and_without_the_shim() {
    let je = Path::new("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2");
    if !je.exists() {
        return skip(
            "jemalloc_s_own_api_is_seen_with_and_without_the_shim",
            "needs libjemalloc.so.2 (apt libjemalloc2)",
        );
    }
    let prog = Path::new(env!("CARGO_TARGET_TMPDIR")).join("jeapi");
    cc(
        &[
            "-O2",
            "-g",
            "-fno-omit-frame-pointer",
            src("jeapi.c").to_str().unwrap(),
            je.to_str().unwrap(),
        ],
        &prog,
    );
    const BLOCKS: u64 = 400;
    const SIZE: u64 = 1000;
    let want = (BLOCKS / 2, BLOCKS / 4 * (2 * SIZE + SIZE));
    let cmd = format!("{} {BLOCKS} {SIZE}", prog.display());
    let out = run(&["memleak", "--json", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(held(&out.stdout, "je_leak_here"), want, "{}", out.stdout);
    let args = [BLOCKS.to_string(), SIZE.to_string()];
    let out = by_pid(&prog, &args, &[]);
    assert!(
        out.stderr
            .contains("libjemalloc.so.2, through the shim loaded"),
        "{}",
        out.stderr
    );
    assert_eq!(held(&out.stdout, "je_leak_here"), want, "{}", out.stdout);
    let out = by_pid(&prog, &args, &["--no-inject"]);
    for f in [
        "mallocx",
        "rallocx",
        "sdallocx",
        "xallocx: in-place resizes not traced",
    ] {
        assert!(out.stderr.contains(f), "{f}: {}", out.stderr);
    }
    assert_eq!(held(&out.stdout, "je_leak_here"), want, "{}", out.stdout);
}

/// Sampled, jemalloc's own mappings are no blocks: an allocation it serves
/// from a new extent mmaps inside a call that was not sampled, and that
/// mmap is the arena the sampled blocks are carved from. Counted as a block
/// of its own, it doubled what a jemalloc program held (Redis in a 96 MiB
/// group: 61 MiB of arenas beside 82 MiB of blocks). Left out, and said.
#[test]
fn sampled_jemalloc_arenas_are_not_counted_as_blocks() {
    let Some(prog) = cxx_with_jemalloc(
        "sampled_jemalloc_arenas_are_not_counted_as_blocks",
        "cxx-jemalloc-sampled",
    ) else {
        return;
    };
    // 100,000 blocks of 200 bytes: 20 MB, about 300 samples at 64 KiB.
    const NEW: u64 = 100_000;
    let mut p = Paused::start(Command::new(&prog).arg(NEW.to_string()));
    let t = Tracer::start(&["memleak", "--json", "--sample-bytes", "64K", "-p", &p.pid()]);
    p.go();
    assert!(wait_child(&mut p.child, std::time::Duration::from_secs(60)).success());
    let out = t.wait(std::time::Duration::from_secs(30));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "memleak");
    let arena = rows.iter().find(|r| {
        user_frames(r)
            .iter()
            .skip(1)
            .any(|f| f.ends_with("[libjemalloc.so.2]"))
    });
    assert!(arena.is_none(), "an arena counted as a block: {arena:?}");
    let (_, bytes) = held(&out.stdout, "cpp_leak_inner");
    let want = (NEW * 200) as f64;
    let ratio = bytes as f64 / want;
    assert!(
        (0.7..1.3).contains(&ratio),
        "{bytes} of {want}: {}",
        out.stdout
    );
    let total: u64 = rows.iter().map(|r| r["bytes"].as_u64().unwrap()).sum();
    // The vector's 800 KB beside the blocks; no arenas.
    assert!((total as f64) < want * 1.3 + 1e6, "{total}: {}", out.stdout);
}
