//! `--stack-mode dwarf` unwound in the kernel program (the default, and
//! `--unwinder kernel`): every event's stack complete through code without
//! frame pointers, the same stacks as the copy path, exact counts, across
//! forks and execs, and honest about where it stops (a library mapped
//! later, a stack deeper than kept).

mod common;

use common::nofp::*;
use common::*;

/// The stacks of `ty` whose innermost frame is `f`: the faults `f` itself
/// took, not those of what it called.
fn in_(stdout: &str, ty: &str, f: &str) -> Vec<serde_json::Value> {
    json_of(stdout, ty)
        .into_iter()
        .filter(|s| user_frames(s).first().is_some_and(|x| x.contains(f)))
        .collect()
}

fn count(stacks: &[serde_json::Value]) -> u64 {
    sum(stacks, "count")
}

/// A stack that ran to its outermost frame: no mark of an early stop.
fn complete(s: &serde_json::Value) -> bool {
    user_frames(s).iter().all(|f| !f.starts_with('[')) && s["note"].is_null()
}

/// faults --stacks --stack-mode dwarf on `cmd`, in the kernel or copied.
fn faults(cmd: &str, unwinder: &str) -> (String, serde_json::Value) {
    dwarf("faults", &["--stacks"], unwinder, cmd)
}

/// The workload's page loop: N faults, each through the three functions,
/// main and glibc's start-up to _start. In the kernel, every one of them is
/// unwound (the count is exact, not sampled) and the stack is the one the
/// copy path unwinds in userspace.
fn same_as_copy_with_exact_counts(cmd: &str, frames: &[&str], n: u64) {
    let (out, summary) = faults(cmd, "kernel");
    assert_eq!(summary["unwinder"], "kernel", "{summary}");
    let loop_stacks = in_(&out, "fault_stack", frames[0]);
    assert_eq!(count(&loop_stacks), n, "{out}");
    // All of them complete, as one stack (frames by function).
    assert_eq!(loop_stacks.len(), 1, "{out}");
    let kernel = user_frames(&loop_stacks[0]);
    assert!(complete(&loop_stacks[0]), "{kernel:#?}");
    assert_in_order(&kernel, frames);
    assert!(kernel.last().unwrap().starts_with("_start"), "{kernel:#?}");
    assert!(
        summary["kunwind_complete"].as_u64().unwrap() >= n,
        "{summary}"
    );

    let (copy_out, copy_summary) = faults(cmd, "copy");
    assert_eq!(copy_summary["unwinder"], "copy", "{copy_summary}");
    let copied = in_(&copy_out, "fault_stack", frames[0]);
    let copied = copied
        .iter()
        .max_by_key(|s| s["count"].as_u64())
        .unwrap_or_else(|| panic!("no copied stack in {}: {copy_out}", frames[0]));
    assert_eq!(user_frames(copied), kernel, "copy path vs kernel");
}

#[test]
fn c_fault_stacks_unwound_in_the_kernel_match_the_copy_path_exactly() {
    let cmd = format!("{} touch 3000", c_workload().display());
    let mut frames = C_TOUCH.to_vec();
    frames.push("__libc_start_call_main");
    same_as_copy_with_exact_counts(&cmd, &frames, 3000);
}

#[test]
fn rust_fault_stacks_unwound_in_the_kernel_match_the_copy_path_exactly() {
    let cmd = format!("{} touch 2000", rust_workload().display());
    let frames = [
        "rust_touch_inner",
        "rust_touch_middle",
        "rust_touch_outer",
        "nofp::main",
        "std::rt::lang_start_internal",
        "__libc_start_call_main",
    ];
    same_as_copy_with_exact_counts(&cmd, &frames, 2000);
}

#[test]
fn brk_stacks_unwound_in_the_kernel_pass_through_glibc() {
    const N: u64 = 40;
    let cmd = format!("{} sbrk {N}", c_workload().display());
    let (out, summary) = dwarf("brkstack", &[], "kernel", &cmd);
    assert_eq!(summary["unwinder"], "kernel", "{summary}");
    let loop_stacks = through(&out, "brk_stack", "heap_grow_outer");
    // The loop's N calls and glibc's first brk(0), one stack by function.
    assert_eq!(count(&loop_stacks), N + 1, "{out}");
    assert!(complete(&loop_stacks[0]), "{out}");
    assert_in_order(&user_frames(&loop_stacks[0]), &C_SBRK);
}

/// Deeper than the frames kept (128): the inner frames are kept, the stack
/// ends with a mark saying it was cut, and the cut is counted; a 120-deep
/// recursion is complete, every frame there.
#[test]
fn a_stack_deeper_than_the_limit_is_reported_truncated_not_wrong() {
    const N: u64 = 50;
    let cmd = format!("{} deep 200 {N}", c_workload().display());
    let (out, summary) = faults(&cmd, "kernel");
    let deep = in_(&out, "fault_stack", "pages_touch_inner");
    assert_eq!(count(&deep), N, "{out}");
    for s in &deep {
        let f = user_frames(s);
        assert_eq!(f.len(), 128, "{f:#?}");
        assert!(f[127].contains("truncated"), "{f:#?}");
        assert!(
            f[1..127].iter().all(|x| x.starts_with("deep_recurse")),
            "{f:#?}"
        );
    }
    assert!(
        summary["kunwind_truncated"].as_u64().unwrap() >= N,
        "{summary}"
    );
    assert!(
        summary["degraded"]["stack_truncated"].as_u64().unwrap() >= N,
        "{summary}"
    );

    let cmd = format!("{} deep 120 {N}", c_workload().display());
    let (out, _) = faults(&cmd, "kernel");
    let shallow = in_(&out, "fault_stack", "pages_touch_inner");
    assert_eq!(count(&shallow), N, "{out}");
    let f = user_frames(&shallow[0]);
    assert!(complete(&shallow[0]), "{f:#?}");
    let recursions = f.iter().filter(|x| x.starts_with("deep_recurse")).count();
    assert_eq!(recursions, 120, "{f:#?}");
    assert_in_order(&f, &["pages_touch_inner", "deep_recurse", "main", "_start"]);
}

/// A table bound (`--unwind-table-size`, 64K: 16,384 rows) too small for
/// glibc (about 28k rows): glibc is left out and counted, and each stack
/// goes as far as the files that fit, then says why it stopped. Every
/// frame of the program is still there and every fault counted.
#[test]
fn a_file_over_the_table_bound_is_left_out_and_counted() {
    const N: u64 = 1000;
    let cmd = format!("{} touch {N}", c_workload().display());
    let (out, summary) = dwarf(
        "faults",
        &["--stacks", "--unwind-table-size", "64K"],
        "kernel",
        &cmd,
    );
    assert_eq!(summary["unwinder"], "kernel", "{summary}");
    assert_eq!(summary["unwind_table_bytes"], 65536, "{summary}");
    assert!(
        summary["unwind_files_over_budget"].as_u64().unwrap() >= 1,
        "{summary}"
    );
    let stacks = in_(&out, "fault_stack", C_TOUCH[0]);
    assert_eq!(count(&stacks), N, "{out}");
    for s in &stacks {
        let f = user_frames(s);
        let mut want = C_TOUCH.to_vec();
        // The return into glibc is known; the step out of it is not.
        want.push("__libc_start_call_main");
        assert_in_order(&f, &want);
        assert_eq!(
            f.last().unwrap(),
            "[code without usable unwind information]",
            "{f:#?}"
        );
        assert!(!f.iter().any(|x| x.starts_with("_start")), "{f:#?}");
    }
    assert!(
        summary["kunwind_no_info"].as_u64().unwrap() >= N,
        "{summary}"
    );
}

/// A library dlopen'd after tracing started: its first call meets no table
/// (said, counted) and has its process's maps read again; its second call,
/// of N pages, unwinds through it completely.
#[test]
fn a_library_loaded_after_tracing_started_unwinds_through() {
    const N: u64 = 500;
    let cmd = format!(
        "{} dlopen {N} {}",
        c_workload().display(),
        c_library().display()
    );
    let (out, summary) = faults(&cmd, "kernel");
    let lib = in_(&out, "fault_stack", "lib_touch_inner");
    let done: Vec<_> = lib.iter().filter(|s| complete(s)).cloned().collect();
    // N of the second call, and the first call's page if its table came
    // in time: never fewer than N, nor more than the faults made there.
    let n = count(&done);
    assert!((N..=N + 1).contains(&n), "{n} complete: {out}");
    assert_in_order(
        &user_frames(&done[0]),
        &["lib_touch_inner", "lib_touch_pages", "main", "_start"],
    );
    assert!(
        summary["unwind_table_files"].as_u64().unwrap() >= 4,
        "{summary}"
    );
}

/// In-kernel unwinding is the default for brkstack (auto) with a command.
fn brk_default(cmd: &str) -> (String, serde_json::Value) {
    let (out, summary) = trace(&["brkstack", "--per-pid", "--json", "-c", cmd]);
    assert_eq!(summary["unwinder"], "kernel", "{summary}");
    (out, summary)
}

/// A forked child's first brk calls come before memtrace has read the
/// fork's record: it starts with its parent's table (copied in the kernel
/// at the fork), so every one of its stacks is complete.
#[test]
fn a_forked_childs_first_stacks_unwind_with_its_parents_table() {
    const N: u64 = 20;
    let (out, summary) = brk_default(&format!("{} fork-sbrk {N}", workload_bin().display()));
    let child = through(&out, "brk_stack", "grow_heap_with_sbrk");
    assert_eq!(count(&child), N, "{out}");
    assert_eq!(child.len(), 1, "{out}");
    assert!(complete(&child[0]), "{out}");
    assert_in_order(
        &user_frames(&child[0]),
        &["__brk", "sbrk", "grow_heap_with_sbrk", "main", "_start"],
    );
    assert_eq!(summary["kunwind_fp_walked"], 0, "{summary}");
}

/// A process that execs mid-trace: the stacks taken before, in the image it
/// left, and after, in the new one (another program), each unwound with
/// its own image's table and symbolized against it, with exact counts.
#[test]
fn stacks_before_and_after_an_exec_each_unwind_in_their_own_image() {
    const N: u64 = 30;
    const M: u64 = 40;
    let cmd = format!(
        "{} brk-exec {N} 4096 100 {} sbrk {M}",
        workload_bin().display(),
        c_workload().display()
    );
    let (out, summary) = brk_default(&cmd);
    // The loop's N calls and the brk(0) before them.
    let before = through(&out, "brk_stack", "grow_heap_with_raw_brk");
    assert_eq!(count(&before), N + 1, "{out}");
    assert_eq!(before.len(), 1, "{out}");
    let f = user_frames(&before[0]);
    assert!(complete(&before[0]), "{f:#?}");
    assert_in_order(&f, &["grow_heap_with_raw_brk", "main", "_start"]);
    assert!(f[0].contains("[memtrace-workload]"), "{f:#?}");
    // The new image's N calls and glibc's first brk(0), one stack.
    let after = through(&out, "brk_stack", "heap_grow_outer");
    assert_eq!(count(&after), M + 1, "{out}");
    assert_eq!(after.len(), 1, "{out}");
    let f = user_frames(&after[0]);
    assert!(complete(&after[0]), "{f:#?}");
    assert_in_order(
        &f,
        &[
            "__brk",
            "sbrk",
            "heap_grow_inner",
            "heap_grow_middle",
            "heap_grow_outer",
            "main",
            "_start",
        ],
    );
    assert!(
        f.iter()
            .any(|x| x.starts_with("heap_grow_inner") && x.contains("[nofp-c]")),
        "{f:#?}"
    );
    // Nothing of one image unwound with the other's table.
    assert!(
        before.iter().chain(&after).all(|s| {
            let f = user_frames(s);
            !(at(&f, "grow_heap_with_raw_brk").is_some() && at(&f, "heap_grow").is_some())
        }),
        "{out}"
    );
    assert_eq!(summary["kunwind_fp_walked"], 0, "{summary}");
}

/// The stack of the one `ty` row `pick` chooses, unwound by `unwinder`, and
/// the run's summary.
fn one_stack(
    tool: &str,
    extra: &[&str],
    unwinder: &str,
    cmd: &str,
    ty: &str,
    pick: impl Fn(&serde_json::Value) -> bool,
) -> (Vec<String>, serde_json::Value) {
    let (out, summary) = dwarf(tool, extra, unwinder, cmd);
    let rows: Vec<_> = json_of(&out, ty).into_iter().filter(|r| pick(r)).collect();
    assert_eq!(rows.len(), 1, "{out}");
    (user_frames(&rows[0]), summary)
}

/// Tools whose events are rare (a stack per record) unwind in the kernel by
/// default with `-c`, with the same whole stack through code without frame
/// pointers as the copy path.
fn in_kernel_as_copied(
    tool: &str,
    extra: &[&str],
    cmd: &str,
    ty: &str,
    pick: fn(&serde_json::Value) -> bool,
) {
    let (kernel, summary) = one_stack(tool, extra, "auto", cmd, ty, pick);
    assert_eq!(summary["unwinder"], "kernel", "{summary}");
    assert_in_order(
        &kernel,
        &[
            "pages_touch_inner",
            "pages_touch_middle",
            "pages_touch_outer",
            "main",
        ],
    );
    assert!(kernel.last().unwrap().starts_with("_start"), "{kernel:#?}");
    let (copied, _) = one_stack(tool, extra, "copy", cmd, ty, pick);
    assert_eq!(copied, kernel, "copy path vs kernel");
}

#[test]
fn mmapsnoop_unwinds_in_the_kernel() {
    // The workload's one mapping of three pages, made in pages_touch_inner
    // through libc (ld.so maps three pages for TLS too). The leaf frame is
    // the sampled instruction pointer, not the unwinder's work.
    let cmd = format!("{} touch 3", c_workload().display());
    in_kernel_as_copied("mmapsnoop", &["--stack"], &cmd, "mmap_call", |r| {
        r["op"] == "mmap"
            && r["len"] == 12288
            && r["user_stack"][0]
                .as_str()
                .is_some_and(|f| f.ends_with("[libc.so.6]"))
    });
}

#[test]
fn rss_threshold_stacks_unwind_in_the_kernel() {
    // 2000 pages touched: RSS crosses 2 MiB inside the page loop.
    let cmd = format!("{} touch 2000", c_workload().display());
    in_kernel_as_copied(
        "rss",
        &["--threshold", "2MiB"],
        &cmd,
        "rss_threshold_stack",
        |_| true,
    );
}

#[test]
fn a_signal_handlers_stacks_unwind_through_the_signal_frame() {
    // 50 pages touched in a SIGUSR1 handler the workload raised itself:
    // every fault's stack goes through the kernel's signal frame (glibc's
    // __restore_rt, described by CFI expressions) to the code it
    // interrupted, inside raise, and on to _start.
    const N: u64 = 50;
    let cmd = format!("{} signal {N}", c_workload().display());
    let (out, summary) = faults(&cmd, "auto");
    assert_eq!(summary["unwinder"], "kernel", "{summary}");
    let stacks = in_(&out, "fault_stack", "signal_touch");
    assert_eq!(count(&stacks), N, "{out}");
    assert_eq!(stacks.len(), 1, "{out}");
    let frames = user_frames(&stacks[0]);
    assert!(complete(&stacks[0]), "{frames:#?}");
    assert_in_order(
        &frames,
        &[
            "signal_touch",
            "signal_handler",
            "__restore_rt",
            "raise [libc.so.6]",
            "signal_raise",
            "main",
        ],
    );
    assert!(frames.last().unwrap().starts_with("_start"), "{frames:#?}");
}
