//! Complete user stacks by default (issue 34): no `--stack-mode`, and code
//! built without frame pointers (C, C++, Python, glibc) is unwound with
//! DWARF in the kernel, system-wide as well as with -p and -c: stacks
//! through the faulting or allocating function to main and _start, with
//! exact counts.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::nofp::*;
use common::*;

/// The stacks of `ty` whose innermost frame is `f`, of processes named `comm`.
fn innermost(stdout: &str, ty: &str, f: &str, comm: &str) -> Vec<serde_json::Value> {
    json_of(stdout, ty)
        .into_iter()
        .filter(|s| s["comm"].as_str().is_some_and(|c| c == comm))
        .filter(|s| user_frames(s).first().is_some_and(|x| x.contains(f)))
        .collect()
}

/// Ran to its outermost frame, no mark of an early stop.
fn complete(s: &serde_json::Value) -> bool {
    let f = user_frames(s);
    f.iter().all(|x| !x.starts_with('['))
        && f.last().is_some_and(|x| x.starts_with("_start"))
        && s["note"].is_null()
}

/// The C workload's touch-loop stacks, which must count its `n` faults.
fn touch_stacks(stdout: &str, n: u64) -> Vec<serde_json::Value> {
    let s = innermost(stdout, "fault_stack", "pages_touch_inner", "nofp-c");
    let counted: u64 = s.iter().map(|s| s["count"].as_u64().unwrap()).sum();
    assert_eq!(counted, n, "{stdout}");
    s
}

fn touch_frames() -> Vec<&'static str> {
    let mut f = C_TOUCH.to_vec();
    f.push("__libc_start_call_main");
    f
}

/// The C workload, its work after `delay_ms`: started before or after the
/// tracer attaches.
fn nofp(args: &[&str], delay_ms: u64) -> std::process::Child {
    Command::new(c_workload())
        .args(args)
        .env("NOFP_DELAY_MS", delay_ms.to_string())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn nofp-c")
}

/// The default asks for no stack mode: the summary says dwarf, unwound in
/// the kernel.
fn assert_default_unwinder(summary: &serde_json::Value) {
    assert_eq!(summary["stack_mode"], "dwarf", "{summary}");
    assert_eq!(summary["unwinder"], "kernel", "{summary}");
}

#[test]
fn system_wide_by_default_a_process_started_after_attach_unwinds_to_start() {
    const N: u64 = 3000;
    let t = Tracer::start(&["faults", "--stacks", "--json", "-d", "6"]);
    // Its tables come from its exec's and mmaps' records: its work after.
    let mut w = nofp(&["touch", &N.to_string()], 700);
    assert!(wait_child(&mut w, WAIT).success());
    let out = t.wait(Duration::from_secs(30));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let summary = json_of(&out.stdout, "summary").pop().expect("a summary");
    assert_default_unwinder(&summary);
    let s = touch_stacks(&out.stdout, N);
    assert_eq!(s.len(), 1, "{s:#?}");
    assert!(complete(&s[0]), "{s:#?}");
    assert_in_order(&user_frames(&s[0]), &touch_frames());
    // The processes running at the start were read in the background.
    assert!(
        summary["unwind_running_read"].as_u64().unwrap() > 0,
        "{summary}"
    );
}

#[test]
fn system_wide_by_default_a_process_running_before_attach_unwinds_to_start() {
    const N: u64 = 2000;
    // Running (asleep) before memtrace starts: its table is built from the
    // running processes' maps, not from its exec.
    let mut w = Paused::start(Command::new(c_workload()).args(["touch", &N.to_string()]));
    let mut t = Tracer::start(&["faults", "--stacks", "--json", "-d", "6"]);
    // Its work once memtrace has read the running processes' maps.
    let read = t.stderr_line(
        |l| l.contains("running processes read in"),
        Duration::from_secs(30),
    );
    assert!(read.is_some(), "the running processes never read");
    w.go();
    assert!(wait_child(&mut w.child, WAIT).success());
    let out = t.wait(Duration::from_secs(30));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s = touch_stacks(&out.stdout, N);
    assert!(s.iter().all(complete), "{s:#?}");
    assert_in_order(&user_frames(&s[0]), &touch_frames());
}

#[test]
fn with_pid_by_default_stacks_are_complete_with_exact_counts() {
    const N: u64 = 2500;
    let mut w = Paused::start(Command::new(c_workload()).args(["touch", &N.to_string()]));
    let pid = w.pid();
    let t = Tracer::start(&["faults", "--stacks", "--json", "-p", &pid]);
    w.go();
    assert!(wait_child(&mut w.child, WAIT).success());
    let out = t.wait(Duration::from_secs(30));
    let summary = json_of(&out.stdout, "summary").pop().expect("a summary");
    assert_default_unwinder(&summary);
    let s = touch_stacks(&out.stdout, N);
    assert_eq!(s.len(), 1, "{s:#?}");
    assert!(complete(&s[0]), "{s:#?}");
}

/// `count --by ustack` on brk gives brkstack's stacks and counts: both
/// through glibc's sbrk (no frame pointers) to main, by default.
#[test]
fn count_by_ustack_equals_brkstack_through_glibc_by_default() {
    const N: u64 = 40;
    let cmd = format!("{} sbrk {N}", c_workload().display());
    let (count_out, count_summary) = trace(&[
        "count",
        "syscalls:sys_enter_brk",
        "--by",
        "ustack",
        "--json",
        "-c",
        &cmd,
    ]);
    let (brk_out, _) = trace(&["brkstack", "--json", "-c", &cmd]);
    assert_default_unwinder(&count_summary);
    let loop_of = |out: &str, ty: &str| -> (u64, Vec<String>) {
        let s = through(out, ty, "heap_grow_outer");
        assert_eq!(s.len(), 1, "{out}");
        (s[0]["count"].as_u64().unwrap(), user_frames(&s[0]))
    };
    let (n_count, f_count) = loop_of(&count_out, "count_stack");
    let (n_brk, f_brk) = loop_of(&brk_out, "brk_stack");
    // The loop's N calls and glibc's first brk(0).
    assert_eq!(n_count, N + 1, "{count_out}");
    assert_eq!(n_count, n_brk);
    assert_eq!(f_count, f_brk);
    assert_in_order(&f_count, &C_SBRK);
    assert!(
        f_count.last().unwrap().starts_with("_start"),
        "{f_count:#?}"
    );
}

const PY: &str = "/usr/bin/python3";

/// How a test points the tracer at its program.
#[derive(Clone, Copy)]
enum Target {
    Cmd,
    Pid,
    SystemWide,
}

/// Whether Debian's python3 (built without frame pointers) is here; a skip
/// names `test` where not.
fn python3(test: &str) -> bool {
    let here = std::path::Path::new(PY).exists();
    if !here {
        skip(test, "no /usr/bin/python3");
    }
    here
}

/// Python filling a list with 20,000 one-page bytearrays, traced by
/// `faults --stacks` as `target` says: its fault stacks. With -p, python
/// allocates once the tracer says it is ready (its tables are built before
/// that), read from its stdin; system-wide it waits `wait_ms` first (for
/// its own tables to be read after its exec).
fn python_fault_stacks(
    target: Target,
    wait_ms: u64,
) -> (Vec<serde_json::Value>, serde_json::Value) {
    let alloc = "a = [bytearray(4096) for _ in range(20000)]";
    let (stdout, summary) = match target {
        Target::Cmd => {
            let cmd = format!("{PY} -c '{alloc}'");
            let (out, summary) = trace(&["faults", "--stacks", "--json", "-c", &cmd]);
            assert_default_unwinder(&summary);
            (out, summary)
        }
        Target::Pid | Target::SystemWide => {
            let code = match target {
                Target::Pid => format!("import sys; sys.stdin.readline(); {alloc}"),
                _ => format!(
                    "import time; time.sleep({}); {alloc}",
                    wait_ms as f64 / 1000.0
                ),
            };
            let spawn = || {
                Command::new(PY)
                    .args(["-c", &code])
                    .stdin(Stdio::piped())
                    .spawn()
                    .expect("spawn python3")
            };
            // System-wide, python starts once memtrace traces (a start
            // slowed by a loaded host outlasted its wait before).
            let (mut p, t) = match target {
                Target::Pid => {
                    let p = spawn();
                    let pid = p.id().to_string();
                    (
                        p,
                        Tracer::start(&["faults", "--stacks", "--json", "-p", &pid]),
                    )
                }
                _ => {
                    let t = Tracer::start(&["faults", "--stacks", "--json", "-d", "6"]);
                    (spawn(), t)
                }
            };
            // Ready: python goes on (system-wide, it ignores this).
            let mut stdin = p.stdin.take().expect("python's stdin");
            let _ = stdin.write_all(b"go\n");
            drop(stdin);
            assert!(wait_child(&mut p, WAIT).success());
            let out = t.wait(Duration::from_secs(30));
            assert_eq!(out.code, 0, "{}", out.stderr);
            let summary = json_of(&out.stdout, "summary").pop().expect("a summary");
            assert_default_unwinder(&summary);
            (out.stdout, summary)
        }
    };
    let stacks = json_of(&stdout, "fault_stack")
        .into_iter()
        .filter(|s| s["comm"] == "python3")
        .collect();
    (stacks, summary)
}

/// Most of python's faults (the list's pages, touched from bytecode) are
/// complete stacks through its Python frames, which stand where the eval
/// loop's native frames were (the module's, after the comprehension's before
/// 3.12), then the native frames that ran it, to main.
/// (The summary, with the unwinder's counts, says why when not.)
fn assert_through_the_eval_loop((stacks, summary): (Vec<serde_json::Value>, serde_json::Value)) {
    let total: u64 = stacks.iter().map(|s| s["count"].as_u64().unwrap()).sum();
    let eval = |s: &&serde_json::Value| at(&user_frames(s), "(<string>:1) [python]").is_some();
    let through_eval: u64 = stacks
        .iter()
        .filter(|s| eval(s) && complete(s))
        .map(|s| s["count"].as_u64().unwrap())
        .sum();
    assert!(
        through_eval >= 10_000,
        "{through_eval} of {total}: {summary}"
    );
    assert!(
        through_eval * 2 > total,
        "{through_eval} of {total}: {summary}"
    );
    let top = stacks
        .iter()
        .filter(eval)
        .max_by_key(|s| s["count"].as_u64())
        .expect("a stack through Python frames");
    let f = user_frames(top);
    assert_in_order(
        &f,
        &["<module> (<string>:1) [python]", "Py_RunMain", "main"],
    );
    assert!(at(&f, "_PyEval_EvalFrameDefault").is_none(), "{f:#?}");
}

#[test]
fn python_fault_stacks_reach_main_by_default() {
    if python3("python_fault_stacks_reach_main_by_default") {
        assert_through_the_eval_loop(python_fault_stacks(Target::Cmd, 0));
    }
}

#[test]
fn python_fault_stacks_with_pid_reach_main_by_default() {
    if python3("python_fault_stacks_with_pid_reach_main_by_default") {
        assert_through_the_eval_loop(python_fault_stacks(Target::Pid, 0));
    }
}

/// Python system-wide, started after attach: its faults, once its tables
/// are in (it waits a moment first), unwind through the eval loop to main.
#[test]
fn system_wide_python_stacks_reach_main_by_default() {
    if python3("system_wide_python_stacks_reach_main_by_default") {
        assert_through_the_eval_loop(python_fault_stacks(Target::SystemWide, 700));
    }
}

/// The C++ workload (`leak.cpp`) built without frame pointers, None where
/// there is no C++ compiler (a skip names `test`).
fn cpp_workload(test: &str) -> Option<std::path::PathBuf> {
    if Command::new("c++").arg("--version").output().is_err() {
        skip(test, "no C++ compiler");
        return None;
    }
    Some(build(
        "nofp-cpp",
        Command::new("c++")
            .args([
                "-O2",
                "-g",
                "-fomit-frame-pointer",
                "-fno-optimize-sibling-calls",
            ])
            .arg(src("leak.cpp")),
    ))
}

/// C++ built without frame pointers: memleak's stacks, by default, name
/// the function that called operator new, not operator new alone, with
/// exact counts, under `-c` (the shim) and `-p` (uprobes on glibc).
#[test]
fn cpp_memleak_stacks_name_the_caller_of_operator_new_by_default() {
    let Some(bin) = cpp_workload("cpp_memleak_stacks_name_the_caller_of_operator_new_by_default")
    else {
        return;
    };
    const N: u64 = 300;
    let cmd = format!("{} {N}", bin.display());
    let (by_cmd, summary) = trace(&["memleak", "--json", "-c", &cmd]);
    assert_default_unwinder(&summary);
    let by_pid = |extra: &[&str]| {
        let mut p = Paused::start(Command::new(&bin).arg(N.to_string()));
        let pid = p.pid();
        let mut argv = vec!["memleak", "--json", "-p", &pid];
        argv.extend_from_slice(extra);
        let t = Tracer::start(&argv);
        p.go();
        assert!(wait_child(&mut p.child, WAIT).success());
        let out = t.wait(Duration::from_secs(30));
        assert_eq!(out.code, 0, "{}", out.stderr);
        out.stdout
    };
    let (injected, probed) = (by_pid(&[]), by_pid(&["--no-inject"]));
    // The shim serves operator new itself (its frames are dropped): the
    // stack starts at the caller, preloaded or loaded into the process.
    // Through uprobes on malloc, at libstdc++'s operator new, then the
    // caller.
    for (out, first) in [
        (&by_cmd, "cpp_leak_inner"),
        (&injected, "cpp_leak_inner"),
        (&probed, "operator new"),
    ] {
        let s = through(out, "memleak", "cpp_leak_inner");
        let n: u64 = s.iter().map(|s| s["count"].as_u64().unwrap()).sum();
        assert_eq!(n, N, "{out}");
        let f = user_frames(&s[0]);
        assert!(f[0].starts_with(first), "{f:#?}");
        assert_in_order(&f, &["cpp_leak_inner", "cpp_leak_outer", "main"]);
        assert!(complete(&s[0]), "{f:#?}");
    }
}

/// The same C++ program traced system-wide, started after attach: the
/// faults of the blocks it fills unwind through libstdc++'s operator new
/// or its own frames to main.
#[test]
fn system_wide_cpp_fault_stacks_reach_main_by_default() {
    let Some(bin) = cpp_workload("system_wide_cpp_fault_stacks_reach_main_by_default") else {
        return;
    };
    let t = Tracer::start(&["faults", "--stacks", "--json", "-d", "5"]);
    // 20,000 blocks of 200 bytes: about a thousand fresh heap pages,
    // touched from cpp_leak_inner (Blob's zeroing is inlined there).
    let mut p = Command::new(&bin)
        .args(["20000", "700"])
        .spawn()
        .expect("spawn the C++ workload");
    assert!(wait_child(&mut p, WAIT).success());
    let out = t.wait(Duration::from_secs(30));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s: Vec<_> = json_of(&out.stdout, "fault_stack")
        .into_iter()
        .filter(|s| s["comm"] == "nofp-cpp" && at(&user_frames(s), "cpp_leak_inner").is_some())
        .collect();
    let n: u64 = s.iter().map(|s| s["count"].as_u64().unwrap()).sum();
    assert!(n >= 900, "{n}: {}", out.stdout);
    assert!(s.iter().all(complete), "{s:#?}");
    assert_in_order(
        &user_frames(&s[0]),
        &["cpp_leak_inner", "cpp_leak_outer", "main"],
    );
}

/// A table too small for every file a run meets: the rows of files no live
/// process maps any more (python's, once it exited) make room for the next
/// (perl's), and every stack after that is still complete. 480K holds the
/// shell, libc and ld.so with python and its libraries (430K here: rows
/// are 4 bytes), or with perl (133K), but not with both.
#[test]
fn rows_of_files_no_process_maps_make_room_for_new_ones() {
    const N: u64 = 500;
    let py = "/usr/bin/python3";
    if !std::path::Path::new(py).exists() || !std::path::Path::new("/usr/bin/perl").exists() {
        return skip(
            "rows_of_files_no_process_maps_make_room_for_new_ones",
            "needs /usr/bin/python3 and /usr/bin/perl",
        );
    }
    let cmd = format!(
        "sh -c '{py} -c pass; /usr/bin/perl -e 1; {} touch {N}'",
        c_workload().display()
    );
    let (out, summary) = dwarf(
        "faults",
        &["--stacks", "--unwind-table-size", "480K"],
        "kernel",
        &cmd,
    );
    assert!(
        summary["unwind_files_evicted"].as_u64().unwrap() >= 1,
        "{summary}"
    );
    assert_eq!(summary["unwind_files_over_budget"], 0, "{summary}");
    let stacks = innermost(&out, "fault_stack", C_TOUCH[0], "nofp-c");
    let n: u64 = stacks.iter().map(|s| s["count"].as_u64().unwrap()).sum();
    assert_eq!(n, N, "{out}");
    assert!(stacks.iter().all(complete), "{stacks:#?}");
    // perl's own stacks, placed after the eviction, reach its main.
    let perl: Vec<_> = json_of(&out, "fault_stack")
        .into_iter()
        .filter(|s| s["comm"] == "perl" && complete(s))
        .collect();
    assert!(!perl.is_empty(), "{out}");
}
