//! `--stack-mode dwarf --unwinder copy`: complete user stacks through code
//! built without frame pointers, unwound here from a copy of the stack (the
//! fallback of in-kernel unwinding, tests/kunwind.rs). The workloads are
//! built without frame pointers from tests/workload/nofp/: a C one (cc) and
//! a Rust one (plain rustc).

mod common;

use common::nofp::*;
use common::*;

/// The stacks through `f`, largest first: the workload's loop (glibc's sbrk
/// takes another path on its first call, so there may be two).
fn stacks_through(stdout: &str, ty: &str, f: &str) -> Vec<serde_json::Value> {
    let v = through(stdout, ty, f);
    assert!(!v.is_empty(), "no {ty} through {f} in {stdout}");
    v
}

#[test]
fn dwarf_brkstack_names_every_c_caller_of_sbrk_in_order() {
    const N: u64 = 40;
    let cmd = format!("{} sbrk {N}", c_workload().display());
    let (out, summary) = dwarf("brkstack", &[], "copy", &cmd);
    assert_eq!(summary["stack_mode"], "dwarf", "{summary}");
    // glibc's first sbrk also asks for the break with brk(0): another call
    // site in the same functions, merged with the loop's (frames are by
    // function).
    let loop_stacks = stacks_through(&out, "brk_stack", "heap_grow_outer");
    let s = &loop_stacks[0];
    assert_eq!(s["count"], N + 1, "{out}");
    assert_eq!(sum(&loop_stacks, "bytes"), N * 4096, "{out}");
    let f = user_frames(s);
    // Through glibc's sbrk (no frame pointers) to main: nothing lost.
    assert_in_order(&f, &C_SBRK);
    assert!(s["note"].is_null(), "{s}");
    assert!(
        summary["unwind_complete"].as_u64().unwrap() >= N,
        "{summary}"
    );

    // The same under frame pointers, to show the difference: printed, not asserted.
    let (fp, fp_summary) = trace(&["brkstack", "--stack-mode", "fp", "--json", "-c", &cmd]);
    assert_eq!(fp_summary["stack_mode"], "fp");
    let fp_frames = user_frames(&json_of(&fp, "brk_stack")[0]);
    let missing: Vec<&str> = C_SBRK[2..]
        .iter()
        .copied()
        .filter(|n| at(&fp_frames, n).is_none())
        .collect();
    eprintln!("fp mode stack: {fp_frames:?}\nfp mode misses: {missing:?}");
}

#[test]
fn dwarf_brkstack_names_every_rust_caller_without_frame_pointers() {
    const N: u64 = 25;
    let cmd = format!("{} {N} 400", rust_workload().display());
    let (out, _) = dwarf("brkstack", &[], "copy", &cmd);
    let loop_stacks = stacks_through(&out, "brk_stack", "rust_heap_grow_outer");
    assert_eq!(loop_stacks[0]["count"], N, "{out}");
    assert_eq!(sum(&loop_stacks, "bytes"), N * 4096, "{out}");
    let f = user_frames(&loop_stacks[0]);
    assert_in_order(
        &f,
        &[
            "sbrk",
            "rust_heap_grow_inner",
            "rust_heap_grow_middle",
            "rust_heap_grow_outer",
            "nofp::main",
        ],
    );
}

#[test]
fn auto_mode_unwinds_brk_with_dwarf() {
    let cmd = format!("{} sbrk 5", c_workload().display());
    let (out, summary) = trace(&["brkstack", "--json", "-c", &cmd]);
    assert_eq!(summary["stack_mode"], "dwarf", "{summary}");
    let loop_stacks = stacks_through(&out, "brk_stack", "heap_grow_outer");
    assert_in_order(&user_frames(&loop_stacks[0]), &["heap_grow_outer", "main"]);
    // Page faults, too many to copy each stack: auto unwinds them in the
    // kernel.
    let (_, summary) = trace(&["faults", "--stacks", "--json", "-c", &cmd]);
    assert_eq!(summary["stack_mode"], "dwarf", "{summary}");
    assert_eq!(summary["unwinder"], "kernel", "{summary}");
}

/// `faults --stacks --stack-mode dwarf` on the C workload touching `n`
/// pages: the fault stacks through its touch loop, the output, the summary.
fn dwarf_faults(n: u64, extra: &[&str]) -> (Vec<serde_json::Value>, String, serde_json::Value) {
    let cmd = format!("{} touch {n}", c_workload().display());
    let mut args = vec!["--stacks"];
    args.extend_from_slice(extra);
    let (out, summary) = dwarf("faults", &args, "copy", &cmd);
    let touch = through(&out, "fault_stack", "pages_touch_outer");
    (touch, out, summary)
}

#[test]
fn dwarf_fault_stacks_name_every_caller_and_account_for_every_fault() {
    const N: u64 = 300;
    let (touch, out, summary) = dwarf_faults(N, &["--stack-size", "8192"]);
    assert!(!touch.is_empty(), "{out}");
    assert_in_order(&user_frames(&touch[0]), &C_TOUCH);
    // Every fault of the loop was unwound or counted as lost: none vanish.
    let unwound = sum(&touch, "count");
    let lost = summary["lost"]["ringbuf_full"].as_u64().unwrap();
    assert!(
        unwound + lost >= N,
        "unwound {unwound} + lost {lost} < {N}: {summary}"
    );
    assert!(unwound <= N + 2, "{unwound} > {N}: {out}");
}

#[test]
fn sampled_dwarf_stacks_scale_their_counts_and_say_so() {
    const N: u64 = 2000;
    const EVERY: u64 = 8;
    let (touch, out, summary) = dwarf_faults(N, &["--sample", "8"]);
    assert_eq!(summary["stack_sample_every"], EVERY, "{summary}");
    let lost = summary["lost"]["ringbuf_full"].as_u64().unwrap();
    let touch = sum(&touch, "count");
    assert_eq!(touch % EVERY, 0, "{out}");
    // One in EVERY per CPU: the estimate is off by at most a period per CPU,
    // plus what the ring buffer could not take (counted, and scaled here).
    let slack = 2 * EVERY + lost * EVERY;
    assert!(
        touch + slack >= N && touch <= N + slack,
        "{touch} vs {N}: {summary}\n{out}"
    );
}

#[test]
fn a_short_stack_copy_is_counted_as_truncated_and_keeps_the_inner_frames() {
    // The calls after the copy unwinder has the image's libraries (read
    // again 30 and 300 ms after the exec): before, a run that ended in
    // 40 ms found no unwind info for them at all, one run in a few.
    let cmd = format!("{} 3 400", rust_workload().display());
    let (out, summary) = dwarf("brkstack", &["--stack-size", "512"], "copy", &cmd);
    assert!(
        summary["unwind_truncated"].as_u64().unwrap() > 0,
        "{summary}"
    );
    let s = json_of(&out, "brk_stack")
        .into_iter()
        .find(|s| {
            s["note"]
                .as_str()
                .is_some_and(|n| n.contains("copied stack"))
        })
        .unwrap_or_else(|| panic!("no truncated stack in {out}"));
    // Frames before the end of the copy are kept.
    assert!(at(&user_frames(&s), "__brk").is_some(), "{s}");
}

/// An event tool: each mmap call's record names its whole stack, through
/// glibc's mmap, from the copy the thread sent just before it.
#[test]
fn dwarf_mmapsnoop_names_every_caller_of_each_call() {
    const N: u64 = 3;
    let cmd = format!("{} touch {N}", c_workload().display());
    let (out, summary) = dwarf("mmapsnoop", &["--stack"], "copy", &cmd);
    assert_eq!(summary["stack_mode"], "dwarf", "{summary}");
    let call = json_of(&out, "mmap_call")
        .into_iter()
        .find(|e| e["len"] == N * 4096 && at(&user_frames(e), "libc.so").is_some())
        .unwrap_or_else(|| panic!("no mmap of {N} pages from libc in {out}"));
    let want: Vec<&str> = std::iter::once("mmap").chain(C_TOUCH).collect();
    assert_in_order(&user_frames(&call), &want);
}

/// Event tools under `--sample`: events left out say so, and are not
/// reported as failed captures.
#[test]
fn sampled_event_stacks_say_which_were_left_out() {
    let cmd = format!("{} touch 3", c_workload().display());
    let (out, _) = dwarf("mmapsnoop", &["--stack", "--sample", "2"], "copy", &cmd);
    let calls = json_of(&out, "mmap_call");
    let left_out = calls
        .iter()
        .filter(|e| user_frames(e) == ["[not sampled (--sample)]"])
        .count();
    let copied = calls
        .iter()
        .filter(|e| at(&user_frames(e), "mmap").is_some())
        .count();
    assert!(left_out > 0 && copied > 0, "{out}");
    assert!(!out.contains("capture failed"), "{out}");
}

/// A stripped binary's frames have no names: each is written as its offset
/// in the file (as perf report writes it), the same in every run under
/// ASLR, and so is the stack's id, which counts those offsets.
#[test]
fn a_stripped_binarys_frames_are_file_offsets_with_one_id_across_runs() {
    const N: u64 = 300;
    let stripped = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("nofp-c-stripped");
    std::fs::copy(c_workload(), &stripped).unwrap();
    let st = std::process::Command::new("strip").arg(&stripped).status();
    assert!(st.unwrap().success(), "strip failed");
    let size = std::fs::metadata(&stripped).unwrap().len();
    let cmd = format!("{} touch {N}", stripped.display());
    let loop_stack = || {
        let (out, _) = dwarf("faults", &["--stacks"], "kernel", &cmd);
        let in_binary: Vec<_> = json_of(&out, "fault_stack")
            .into_iter()
            .filter(|s| {
                user_frames(s)
                    .first()
                    .is_some_and(|f| f.ends_with(" [nofp-c-stripped]"))
            })
            .collect();
        // The loop's faults are there; in one whole-suite run in CI one
        // of the 300 unwound to another stack (not reproduced alone or
        // under load; noted in issue 34): the loop's stack is the largest.
        let total: u64 = in_binary.iter().map(|s| s["count"].as_u64().unwrap()).sum();
        assert!((N - 2..=N).contains(&total), "{out}");
        let s = in_binary
            .iter()
            .max_by_key(|s| s["count"].as_u64())
            .unwrap_or_else(|| panic!("no stack in the stripped binary: {out}"));
        assert!(s["count"].as_u64().unwrap() + 2 >= N, "{out}");
        (user_frames(s), s["stack_id"].as_str().unwrap().to_string())
    };
    let (frames, id) = loop_stack();
    let own: Vec<&String> = frames
        .iter()
        .filter(|f| f.ends_with(" [nofp-c-stripped]"))
        .collect();
    // The three page-touching functions, main and _start at least.
    assert!(own.len() >= 5, "{frames:#?}");
    for f in &own {
        let hex = f.strip_prefix("0x").and_then(|f| f.split(' ').next());
        let off = hex.and_then(|h| u64::from_str_radix(h, 16).ok());
        assert!(off.is_some_and(|o| o < size), "not a file offset: {f}");
    }
    assert!(frames
        .iter()
        .any(|f| f.starts_with("__libc_start_call_main")));
    let (again, id_again) = loop_stack();
    assert_eq!(again, frames, "the same frames in a second run");
    assert_eq!(id_again, id);
}
