//! brkstack over long runs and thousands of children: the map never fills,
//! exited processes' stacks resolve past the bound, and every call of every
//! child is in every report (text, folded, JSON, record).

use super::*;

/// 1200 short processes each calling sbrk, counted by process and stack
/// in a map of 2048 keys (stacks unwound in the kernel: about 5 a process,
/// 6000 in all): without interval reports memtrace empties the map as it
/// goes, so nothing is lost and every call is counted.
#[test]
fn long_runs_without_intervals_never_fill_the_map() {
    let cmd = format!(
        "for i in $(seq 1200); do {} sbrk 2 8192; done",
        workload_bin().display()
    );
    let run_with = |extra: &[&str]| {
        let mut args = vec!["brkstack", "--keys", "2048", "--json", "-c", &cmd];
        args.extend_from_slice(extra);
        let out = run(&args);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let s = json_of(&out.stdout, "summary");
        (
            s[0]["lost"]["map_full"].as_u64().unwrap(),
            s[0]["events"].as_u64().unwrap(),
        )
    };
    // The churn does overflow such a map when nothing empties it.
    let (full, _) = run_with(&["-i", "600"]);
    assert!(full > 0, "the churn never filled the map");
    let (full, events) = run_with(&[]);
    assert_eq!(full, 0);
    assert!(events >= 2400, "{events} brk calls counted");
}

/// Past the bound on kept counts, the counts by stack of exited processes
/// are symbolized and kept by what they show: memtrace's memory stays
/// bounded, every call is still counted with its stack, and no row is a
/// faceless "folded" count (it was one per process).
#[test]
fn stacks_of_exited_processes_resolve_past_the_bound_and_none_is_lost() {
    // Unwound in the kernel (counts by stack) and from copies (samples).
    exited_stacks_resolve(&[], "stacks_resolved");
    exited_stacks_resolve(&["--unwinder", "copy"], "samples_resolved");
}

fn exited_stacks_resolve(unwinder: &[&str], resolved: &str) {
    let cmd = format!(
        // The loop may end within one round of reclaiming (every 250 ms):
        // the sleep makes sure a round meets its processes gone.
        "for i in $(seq 300); do {} sbrk 3 8192; done; sleep 0.6",
        workload_bin().display()
    );
    let mut args = vec!["brkstack", "--max-kept", "50", "--top", "1000000"];
    args.extend(unwinder);
    args.extend(["--json", "-c", &cmd]);
    let out = run(&args);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s = &json_of(&out.stdout, "summary")[0];
    assert_eq!(s["stack_mode"], "dwarf", "{s}");
    assert_eq!(s["lost_total"].as_u64(), Some(0), "{s}");
    // Resolved to rows as their processes exited: copied stacks were kept
    // as addresses to the end (brkstack's peak under a churn), or folded
    // into faceless rows past the bound.
    assert!(s[resolved].as_u64().unwrap_or(0) > 0, "{s}");
    assert_eq!(s["stacks_folded"].as_u64(), None, "{s}");
    let (calls, bytes) = totals(&out.stdout);
    assert_eq!(calls, s["events"].as_u64().unwrap(), "{s}");
    // Each process grew its heap by at least its three 8 KiB calls.
    assert!(calls >= 900 && bytes >= 300 * 3 * 8192, "{calls} {bytes}");
    let all = stacks(&out.stdout);
    assert!(
        all.iter()
            .all(|r| !user_frames(r).iter().any(|f| f.contains("folded"))),
        "a folded row: {}",
        out.stdout
    );
    // The loop's stack is one row for the 300 processes, with all their calls.
    let sbrk = all
        .iter()
        .find(|r| {
            user_frames(r)
                .iter()
                .any(|f| f.contains("grow_heap_with_sbrk"))
        })
        .unwrap_or_else(|| panic!("{}", out.stdout));
    // All but the few calls of a process whose maps memtrace had not read
    // yet (they show as addresses, in rows of their own: issue 34's
    // tables_pending); the exact total is checked above.
    let n = sbrk["count"].as_u64().unwrap();
    assert!((890..=900).contains(&n), "{sbrk}");
    let p = sbrk["processes"].as_u64().unwrap();
    assert!((297..=300).contains(&p), "{sbrk}");
    // Far fewer rows than processes.
    assert!(all.len() < 300, "{}", all.len());
}

/// The counts of the text report's stacks and its "... and K more" line.
fn text_counts(stdout: &str) -> (Vec<u64>, Option<(u64, u64)>) {
    let mut shown = Vec::new();
    let mut rest = None;
    let mut lines = stdout.lines();
    while let Some(l) = lines.next() {
        if l.starts_with("    -- ") {
            let n = lines.next().unwrap_or_default().trim();
            shown.push(n.split(',').next().unwrap().parse().unwrap());
        } else if let Some(r) = l.strip_prefix("... and ") {
            // "... and K more stacks, M events, B bytes (--top shows more)"
            let w: Vec<&str> = r.split([' ', ',']).filter(|w| !w.is_empty()).collect();
            rest = Some((w[0].parse().unwrap(), w[3].parse().unwrap()));
        }
    }
    (shown, rest)
}

fn summary_events(stderr: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("memtrace brkstack:"))
        .unwrap_or_else(|| panic!("{stderr}"));
    line.split(", ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The row of the stack through the children's sbrk loop.
fn children_row(stdout: &str) -> serde_json::Value {
    stacks(stdout)
        .into_iter()
        .find(|s| {
            user_frames(s)
                .iter()
                .any(|f| f.contains("grow_heap_with_sbrk"))
        })
        .unwrap_or_else(|| panic!("no stack through grow_heap_with_sbrk"))
}

/// 2,500 children forked one after another, each calling sbrk 5 times from
/// one function: every call is in the answer, however it is printed. The
/// text report shows its top stacks and says what the others add up to;
/// JSON, folded output and the record carry every stack; the children's
/// stack is one row for all of them, not one per child (it was cut at
/// 2,000 entries before merging: the rows added up to 8,000 of 15,003).
#[test]
fn every_call_of_thousands_of_children_is_in_every_report() {
    const N: u64 = 2500;
    let cmd = format!("{} fork-sbrk-many {N} 5", workload_bin().display());
    let rec = std::env::temp_dir().join(format!("memtrace-churn-{}.rec", std::process::id()));
    let rec = rec.to_str().unwrap();

    let out = run(&["brkstack", "--json", "--record", rec, "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let summary = &json_of(&out.stdout, "summary")[0];
    let events = summary["events"].as_u64().unwrap();
    assert!(events >= 5 * N, "{summary}");
    assert_eq!(summary["lost_total"].as_u64(), Some(0), "{summary}");
    let uncounted = &summary["degraded"]["processes_uncounted"];
    assert_eq!(uncounted.as_u64(), Some(0), "{summary}");
    let (calls, _) = totals(&out.stdout);
    assert_eq!(calls, events, "JSON rows against the summary");
    assert!(json_of(&out.stdout, "rest").is_empty(), "JSON was cut");
    let all = stacks(&out.stdout);
    let children = children_row(&out.stdout);
    assert_eq!(children["count"].as_u64(), Some(5 * N), "{children}");
    assert_eq!(children["processes"].as_u64(), Some(N), "{children}");
    assert!(
        all.iter()
            .all(|s| !user_frames(s).iter().any(|f| f.contains("folded"))),
        "a faceless folded row"
    );

    // The record holds every stack too.
    let rep = run(&["report", rec, "--json"]);
    assert_eq!(rep.code, 0, "{}", rep.stderr);
    assert_eq!(totals(&rep.stdout).0, events, "record against the summary");
    let _ = std::fs::remove_file(rec);

    // Text: the top stack shown, the rest said, and both add up to the total.
    let out = run(&["brkstack", "--top", "1", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let events = summary_events(&out.stderr);
    let (shown, rest) = text_counts(&out.stdout);
    assert_eq!(shown.len(), 1, "{}", out.stdout);
    assert_eq!(shown[0], 5 * N, "{}", out.stdout);
    let (more, left) = rest.unwrap_or_else(|| panic!("no rest line: {}", out.stdout));
    assert!(more > 0);
    assert_eq!(shown.iter().sum::<u64>() + left, events, "{}", out.stdout);

    // Folded output, without --top, carries every stack.
    let out = run(&["brkstack", "--folded", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let events = summary_events(&out.stderr);
    let folded: u64 = out
        .stdout
        .lines()
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(folded, events, "folded lines against the summary");
}

/// Children forked one after another share their parent's image: their
/// identical stacks are one key in the kernel, so 2,500 of them fit a map
/// of 32 keys with nothing lost, and the row names each child. Keyed by
/// process (`--per-pid`), the same map is full at once.
#[test]
fn forked_children_share_their_stacks_keys_in_the_kernel() {
    const N: u64 = 2500;
    let cmd = format!("{} fork-sbrk-many {N} 5", workload_bin().display());
    let out = run(&["brkstack", "--keys", "32", "--json", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let summary = &json_of(&out.stdout, "summary")[0];
    assert_eq!(summary["lost_total"].as_u64(), Some(0), "{summary}");
    let uncounted = &summary["degraded"]["processes_uncounted"];
    assert_eq!(uncounted.as_u64(), Some(0), "{summary}");
    let children = children_row(&out.stdout);
    assert_eq!(children["count"].as_u64(), Some(5 * N), "{children}");
    assert_eq!(children["processes"].as_u64(), Some(N), "{children}");

    let out = run(&[
        "brkstack",
        "--keys",
        "32",
        "--per-pid",
        "--json",
        "-c",
        &cmd,
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let summary = &json_of(&out.stdout, "summary")[0];
    assert!(
        summary["lost"]["map_full"].as_u64().unwrap() > N,
        "keyed by process, the map should have filled: {summary}"
    );
}
