//! What memleak's fast paths must not get wrong: the shim's sites that
//! Linux 6.17 on enters by a system call, in forked children; the
//! in-kernel unwinder's memo of the last stack, between stacks that differ
//! by one word; the shim's allocations queued with the memo's stack, in
//! batches that reach the kernel out of order between threads or not
//! before a report.

use super::*;

/// On Linux 6.17 on, a shim site a process ran is rewritten into a call
/// into a trampoline that a forked child does not have: a child running
/// it crashed. Each process of a chain deeper than the shim's generations
/// of sites runs the allocator after its parent did; none crashes and the
/// blocks of every one show.
#[test]
fn every_process_of_a_fork_chain_is_seen_and_none_crashes() {
    const DEPTH: u64 = 10;
    let cmd = format!(
        "{} fork-chain {DEPTH} {K} {SIZE} 30000",
        workload_bin().display()
    );
    let args = ["memleak", "--json", "--children", "--top", "50", "-c", &cmd];
    let mut t = Tracer::start(&args);
    let ready = t.stdout_line(|l| l.trim() == "ready", WAIT);
    assert!(ready.is_some(), "the chain did not end: {}", t.early_stderr);
    let out = t.interrupt();
    let rows = json_of(&out.stdout, "memleak");
    let n = (DEPTH + 1) * K;
    assert_eq!(
        held(&rows, "leak_small_blocks"),
        (n, n * SIZE),
        "{}",
        out.stdout
    );
}

/// The in-kernel unwinder reuses the stack it unwound last when every word
/// it read is unchanged, and the shim reuses it from the memo without
/// trapping: allocations from two paths in turn, whose stacks differ only
/// by one return address at the same place, each keep their own stack,
/// exactly; a run from one path is unwound once (its later allocations
/// recalled in the kernel or taken from the memo in the process).
#[test]
fn stacks_apart_by_one_return_address_are_told_apart() {
    const N: u64 = 2000;
    let cmd = format!(
        "{} alternate {N}",
        super::common::nofp::c_workload().display()
    );
    let out = run(&["memleak", "--json", "--top", "50", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "memleak");
    let through = |f: &str| {
        rows.iter()
            .filter(|r| user_frames(r).iter().any(|x| x.starts_with(f)))
            .map(|r| r["count"].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(
        (through("alt_a"), through("alt_b")),
        (N / 2 + N, N / 2),
        "{}",
        out.stdout
    );
    let summary = &json_of(&out.stdout, "summary")[0];
    let repeated = summary["kunwind_repeated"].as_u64().unwrap();
    let from_memo = summary["allocations_from_memo"].as_u64().unwrap();
    assert!(repeated + from_memo >= N - 1, "{summary}");
}

/// Blocks allocated in one thread and freed in another: each thread's
/// batch reaches the kernel on its own, so a free can come before its
/// block's allocation. None is held, none of the frees is untracked, and
/// the blocks kept after are held exactly.
#[test]
fn blocks_freed_by_another_thread_before_their_batch_came_are_not_held() {
    const N: u64 = 20_000;
    const KEPT: u64 = 10;
    let cmd = format!("{} handoff {N} {KEPT}", workload_bin().display());
    let out = run(&["memleak", "--json", "--top", "50", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "memleak");
    assert_eq!(held(&rows, "handed_over"), (0, 0), "{}", out.stdout);
    assert_eq!(
        held(&rows, "kept_owner"),
        (KEPT, KEPT * 48),
        "{}",
        out.stdout
    );
    let s = &json_of(&out.stdout, "summary")[0];
    assert!(s["allocations_from_memo"].as_u64().unwrap() >= N / 2, "{s}");
    // A handful are untracked without the memo too (frees of blocks made
    // before the shim's start); a free taken for a stranger's would be
    // thousands.
    assert!(s["frees_untracked"].as_u64().unwrap() < 100, "{s}");
}

/// Blocks from the memo wait in the thread's batch until it is reported;
/// a report while the thread idles reads them there: all are held.
#[test]
fn blocks_still_in_a_batch_are_held_in_a_report() {
    const K: u64 = 20;
    let cmd = format!("{} kept-then-idle {K}", workload_bin().display());
    let mut t = Tracer::start(&["memleak", "--json", "--top", "50", "-c", &cmd]);
    let kept = t.stdout_line(|l| l.trim() == "kept", WAIT);
    assert!(kept.is_some(), "no 'kept': {}", t.early_stderr);
    let out = t.interrupt();
    let rows = json_of(&out.stdout, "memleak");
    assert_eq!(held(&rows, "kept_owner"), (K, K * 100), "{}", out.stdout);
    let s = &json_of(&out.stdout, "summary")[0];
    assert!(
        s["allocations_in_batches"].as_u64().unwrap() >= K - 2,
        "{s}"
    );
}

/// A caller that keeps a new value in rbp at each call, saved where its
/// unwind information says: the unwind never uses that word, so it is not
/// part of the stack's memo, and every allocation after the first comes
/// from the memo, each in its exact place.
#[test]
fn a_saved_rbp_the_unwind_never_uses_does_not_void_the_memo() {
    if !cfg!(target_arch = "x86_64") {
        skip(
            "a_saved_rbp_the_unwind_never_uses_does_not_void_the_memo",
            "x86_64 only",
        );
        return;
    }
    const N: u64 = 3000;
    let cmd = format!("{} churn {N}", super::common::nofp::c_workload().display());
    let out = run(&["memleak", "--json", "--top", "50", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "memleak");
    assert_eq!(held(&rows, "churn_leaf"), (N, N * 64), "{}", out.stdout);
    let churned: Vec<_> = rows
        .iter()
        .filter(|r| user_frames(r).iter().any(|f| f.starts_with("churn_leaf")))
        .collect();
    for r in &churned {
        super::common::nofp::assert_in_order(
            &user_frames(r),
            &["churn_leaf", "keep_in_rbp", "churn_loop", "main"],
        );
    }
    let s = &json_of(&out.stdout, "summary")[0];
    let from_memo = s["allocations_from_memo"].as_u64().unwrap();
    assert!(from_memo >= N - 2, "{s}");
}
