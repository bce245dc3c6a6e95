//! What memleak keeps: a full table counted, exited processes moved out of
//! the tables, frees reported in batches, and the kernel's own allocations
//! (kernel mode).

use super::*;

#[test]
fn a_full_table_is_counted_not_silent() {
    let cmd = format!("{} {}", workload_bin().display(), leak_args(0).join(" "));
    let out = run(&["memleak", "--json", "--max-allocs", "4", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "memleak");
    let shown: u64 = rows.iter().map(|r| r["count"].as_u64().unwrap()).sum();
    assert!(shown <= 4, "{}", out.stdout);
    // 10 leaked blocks and more: at least 6 could not be kept.
    assert!(lost(&out.stdout, "map_full") >= 6, "{}", out.stdout);
    assert!(out.stderr.contains("map_full"), "{}", out.stderr);
}

/// A loop of short processes, each leaving blocks and stacks of its own:
/// memtrace moves what a process held out of the kernel's tables once it
/// exits, so tables that hold a fraction of the loop's stacks never fill.
/// The loop makes about 3,700 keys, 800 a second; a round every 250 ms
/// leaves about 230 in the table. 2,048 is half the loop's keys and room
/// for two seconds without a round (a CI host running other binaries'
/// compilers beside it filled 1,024 when rounds came every 500 ms).
#[test]
fn processes_that_exit_never_fill_the_tables() {
    const N: u64 = 100;
    let cmd = format!(
        // Paced so that a round of reclaiming (every 250 ms) meets a few
        // processes at a time; the whole loop has thousands of stacks.
        "for i in $(seq {N}); do {} malloc-loop 100 >/dev/null; sleep 0.05; done",
        workload_bin().display()
    );
    let out = run(&["memleak", "--json", "--max-stacks", "2048", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s = &json_of(&out.stdout, "summary")[0];
    assert_eq!(lost(&out.stdout, "map_full"), 0, "{s}");
    // The workload processes and sleeps exited, holding some blocks (those
    // of the last round end with the run, in the live tables still).
    assert!(s["exited_processes"].as_u64().unwrap() >= N, "{s}");
    assert!(s["held_at_exit"].as_u64().unwrap() >= N, "{s}");
    assert!(s["exited_blocks_swept"].as_u64().unwrap() > 0, "{s}");
    // Every malloc/free pair of the loops was followed to its free.
    assert!(s["frees"].as_u64().unwrap() >= N * 100, "{s}");
    let rows = json_of(&out.stdout, "memleak");
    assert!(
        rows.iter()
            .any(|r| r["note"] == "held when the process exited"),
        "{}",
        out.stdout
    );
}

/// Processes of one program that exit holding blocks from the same code:
/// one row by what it shows, with every block each one held and every
/// process named, and the walked stacks let go once resolved to frames
/// (kept per process, they grew memleak's memory with every process and
/// past a bound folded into faceless rows).
#[test]
fn what_exited_processes_held_is_one_row_per_code_path() {
    const N: u64 = 20;
    let cmd = format!(
        "for i in $(seq {N}); do {} {} >/dev/null; sleep 0.1; done",
        workload_bin().display(),
        leak_args(0).join(" ")
    );
    let out = run(&["memleak", "--json", "--top", "1000", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "memleak");
    assert_eq!(
        held(&rows, "leak_small_blocks"),
        (N * K, N * K * SIZE),
        "{}",
        out.stdout
    );
    assert_eq!(
        held(&rows, "leak_big_blocks"),
        (N * M, N * M * BIG),
        "{}",
        out.stdout
    );
    let small: Vec<_> = rows
        .iter()
        .filter(|r| {
            user_frames(r)
                .first()
                .is_some_and(|f| f.contains("leak_small_blocks"))
        })
        .collect();
    assert_eq!(small.len(), 1, "{}", out.stdout);
    assert_eq!(
        small[0]["note"], "held when the process exited",
        "{}",
        out.stdout
    );
    assert_eq!(small[0]["processes"], N, "{}", out.stdout);
    let s = &json_of(&out.stdout, "summary")[0];
    assert_eq!(lost(&out.stdout, "map_full"), 0, "{s}");
    // Resolved as the loop ran, not only at the end.
    assert!(s["stacks_resolved"].as_u64().unwrap_or(0) >= N, "{s}");
    assert!(s["user_stacks_released"].as_u64().unwrap_or(0) > 0, "{s}");
}

/// Outstanding kernel allocations made under `alloc_pipe_info`, reported
/// while the workload still holds (or has closed) its pipes.
fn pipe_allocations(keep: bool) -> u64 {
    const N: u64 = 400;
    let t = Tracer::start(&["memleak", "--json", "--top", "100000"]);
    let keep = if keep { "1" } else { "0" };
    let mut w = Workload::start(&["pipes", &N.to_string(), keep, "2000"]);
    w.go();
    std::thread::sleep(Duration::from_millis(1000));
    let out = t.interrupt();
    assert!(w.wait().success());
    assert_eq!(out.code, 0, "{}", out.stderr);
    json_of(&out.stdout, "memleak")
        .iter()
        .filter(|r| {
            r["kernel_stack"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f.as_str().unwrap().contains("alloc_pipe_info"))
        })
        .map(|r| r["count"].as_u64().unwrap())
        .sum()
}

#[test]
fn kernel_mode_sees_what_open_pipes_hold() {
    // Each open pipe holds its pipe_inode_info and its buffer array: two
    // allocations under alloc_pipe_info. Other processes make pipes too
    // (system-wide, and the other test binaries run beside this one), and
    // kernel rows are not split by process: hence the slack above.
    let open = pipe_allocations(true);
    assert!(
        (800..1000).contains(&open),
        "{open} pipe allocations outstanding"
    );
    let closed = pipe_allocations(false);
    assert!(
        closed < 200,
        "{closed} pipe allocations outstanding after close"
    );
}

/// Frees the shim holds in a batch, then the same addresses handed out
/// again from another function, then _exit (no destructor runs): the new
/// blocks are held, the old ones released (by the new allocations, and the
/// batch reported at the exit by the kernel does not take the new ones).
#[test]
fn addresses_freed_in_a_batch_and_handed_out_again_keep_their_new_blocks() {
    let cmd = format!("{} reuse-then-exit 20", workload_bin().display());
    let out = run(&["memleak", "--json", "--top", "50", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "memleak");
    assert_eq!(held(&rows, "second_owner"), (20, 2000), "{}", out.stdout);
    assert_eq!(held(&rows, "first_owner"), (0, 0), "{}", out.stdout);
}

/// A report while frees are still in the shim's batch (the command idles
/// after freeing; -d ends the run first): memtrace reads them from the
/// process and does not count their blocks as held.
#[test]
fn frees_still_in_a_batch_are_reported_before_a_report() {
    let cmd = format!("{} freed-then-idle 20", workload_bin().display());
    let out = run(&["memleak", "--json", "--top", "50", "-d", "2", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "memleak");
    assert_eq!(held(&rows, "first_owner"), (0, 0), "{}", out.stdout);
    // Applied in the kernel or read from the batch, every free is counted.
    let s = &json_of(&out.stdout, "summary")[0];
    let frees = s["frees"].as_u64().unwrap() + s["frees_in_batches"].as_u64().unwrap();
    assert!(frees >= 20, "{s}");
}
