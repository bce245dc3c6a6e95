//! `memtrace count` and `memtrace trace`: any tracepoint, fields by name.

mod common;

use common::*;

fn counts(stdout: &str) -> Vec<serde_json::Value> {
    json_of(stdout, "count")
}

#[test]
fn brk_by_user_stack_matches_the_known_calls_and_brkstack() {
    const N: u64 = 70;
    let outs = trace_workload(
        &["rawbrk", &N.to_string(), "4096"],
        &[
            &[
                "count",
                "syscalls:sys_enter_brk",
                "--by",
                "ustack",
                "--stack-mode",
                "fp",
            ],
            &["brkstack", "--stack-mode", "fp"],
        ],
    );
    let site = |out: &str, ty: &str| -> u64 {
        json_of(out, ty)
            .iter()
            .filter(|s| {
                user_frames(s)
                    .first()
                    .is_some_and(|f| f.contains("grow_heap_with_raw_brk"))
            })
            .map(|s| s["count"].as_u64().unwrap())
            .sum()
    };
    // The loop's brk calls plus the brk(0) before it: both in the function.
    assert_eq!(site(&outs[0], "count_stack"), N + 1, "{}", outs[0]);
    assert_eq!(site(&outs[1], "brk_stack"), N + 1, "{}", outs[1]);
}

#[test]
fn sums_a_field_of_known_sizes() {
    let outs = trace_workload(
        &["madvise", "40", "12288"],
        &[&["count", "syscalls:sys_enter_madvise", "--sum", "len_in"]],
    );
    let c = counts(&outs[0]);
    assert_eq!(c.len(), 1, "{}", outs[0]);
    assert_eq!(c[0]["count"], 40);
    assert_eq!(c[0]["sum_len_in"], 40 * 12288);
}

#[test]
fn filters_and_keys_by_fields_in_the_kernel() {
    let outs = trace_workload(
        &["madvise", "25", "4096", "8192"],
        &[
            &[
                "count",
                "syscalls:sys_enter_madvise",
                "--by",
                "len_in",
                "--filter",
                "len_in >= 8192",
            ],
            &["count", "syscalls:sys_enter_madvise", "--by", "len_in,comm"],
            &[
                "trace",
                "syscalls:sys_enter_madvise",
                "--filter",
                "len_in==8192",
            ],
        ],
    );
    let c = counts(&outs[0]);
    assert_eq!(c.len(), 1, "{}", outs[0]);
    assert_eq!(
        (c[0]["len_in"].as_u64(), c[0]["count"].as_u64()),
        (Some(8192), Some(25))
    );
    let mut both: Vec<(u64, u64)> = counts(&outs[1])
        .iter()
        .map(|r| (r["len_in"].as_u64().unwrap(), r["count"].as_u64().unwrap()))
        .collect();
    both.sort();
    assert_eq!(both, [(4096, 25), (8192, 25)], "{}", outs[1]);
    assert_eq!(counts(&outs[1])[0]["comm"], "memtrace-worklo");
    let lines = json_of(&outs[2], "trace");
    assert_eq!(lines.len(), 25, "{}", outs[2]);
    assert!(
        lines
            .iter()
            .all(|l| l["len_in"] == 8192 && l["behavior"] == 0),
        "{}",
        outs[2]
    );
}

#[test]
fn several_tracepoints_are_told_apart() {
    let outs = trace_workload(
        &["madvise", "30", "4096"],
        &[&[
            "count",
            "syscalls:sys_enter_madvise",
            "syscalls:sys_enter_munmap",
        ]],
    );
    let c = counts(&outs[0]);
    let of = |tp: &str| {
        c.iter()
            .find(|r| r["tracepoint"] == tp)
            .map(|r| r["count"].as_u64().unwrap())
    };
    assert_eq!(of("syscalls:sys_enter_madvise"), Some(30), "{}", outs[0]);
    // The workload's own munmap of its region, and whatever its exit unmaps.
    assert!(
        of("syscalls:sys_enter_munmap").is_some_and(|n| n >= 1),
        "{}",
        outs[0]
    );
}

#[test]
fn wildcards_list_every_tracepoint_tracefs_has() {
    let dir = [
        "/sys/kernel/tracing/events/vmscan",
        "/sys/kernel/debug/tracing/events/vmscan",
    ]
    .into_iter()
    .find(|d| std::path::Path::new(d).is_dir())
    .expect("tracefs vmscan events");
    let mut want: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| format!("vmscan:{}", e.file_name().to_string_lossy()))
        .collect();
    want.sort();
    let out = run(&["count", "vmscan:*", "-d", "1", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let mut got: Vec<String> = counts(&out.stdout)
        .iter()
        .map(|r| r["tracepoint"].as_str().unwrap().to_string())
        .collect();
    got.sort();
    assert_eq!(got, want);
}

#[test]
fn trace_decodes_strings_by_type() {
    let bin = workload_bin();
    // Run from a shell: the -c command's own exec comes before tracing does.
    let cmd = format!("/bin/sh -c '{} exit 0; exit 0'", bin.display());
    let out = run(&["trace", "sched:sched_process_exec", "--json", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let lines = json_of(&out.stdout, "trace");
    assert!(
        lines.iter().any(|l| l["filename"] == bin.to_str().unwrap()),
        "{}",
        out.stdout
    );
}

#[test]
fn interval_reports_stop_after_the_count() {
    let out = run(&[
        "count",
        "sched:sched_switch",
        "-i",
        "200ms",
        "--count",
        "3",
        "--json",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    // One row per report, and no report after the last one.
    assert_eq!(counts(&out.stdout).len(), 3, "{}", out.stdout);
}

#[test]
fn bad_patterns_and_fields_exit_2_naming_the_closest() {
    let cases: [(&[&str], &str); 6] = [
        (&["count", "kmem:kmaloc"], "did you mean kmem:kmalloc"),
        (&["count", "kmem"], "expected CATEGORY:NAME"),
        (
            &["count", "kmem:kmalloc", "--by", "bytes_aloc"],
            "did you mean bytes_alloc",
        ),
        (
            &["count", "sched:sched_process_exec", "--sum", "filename"],
            "only numeric fields",
        ),
        (
            &["count", "kmem:kmalloc", "--filter", "bytes_alloc ~ 4"],
            "is not a filter",
        ),
        (&["trace", "nosuch:*"], "no tracepoint matches"),
    ];
    for (args, msg) in cases {
        let out = run(args);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(msg), "{args:?}: {}", out.stderr);
        assert_eq!(
            out.stderr.trim().lines().count(),
            1 + out.stderr.matches("For more").count() * 2,
            "{args:?}: {}",
            out.stderr
        );
    }
}

#[test]
fn nothing_is_counted_before_the_configuration_is_in_place() {
    // kmalloc fires constantly, also between attach and configuration: an
    // event then must not pass as tracepoint 0 with no filter.
    let out = run(&[
        "count",
        "kmem:kmalloc",
        "--filter",
        "bytes_alloc > 1000000000",
        "--by",
        "pid",
        "-d",
        "1",
        "--json",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(counts(&out.stdout).is_empty(), "{}", out.stdout);
}

#[test]
fn a_negative_value_for_an_unsigned_field_is_an_error() {
    let out = run(&["count", "kmem:kmalloc", "--filter", "bytes_alloc > -1"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("unsigned"), "{}", out.stderr);
}

#[test]
fn trace_shows_the_user_strings_syscalls_point_to() {
    // A path only this test opens: the line that names it is the open.
    let path = format!("/tmp/memtrace-oneliners-{}", std::process::id());
    // Empty: what cat prints goes to the same stdout as the JSON lines.
    std::fs::write(&path, "").unwrap();
    let cmd = format!("cat {path}");
    let out = run(&["trace", "syscalls:sys_enter_openat", "--json", "-c", &cmd]);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(out.code, 0, "{}", out.stderr);
    let lines = json_of(&out.stdout, "trace");
    let open = lines
        .iter()
        .find(|l| l["filename"] == path.as_str())
        .unwrap_or_else(|| panic!("{}", out.stdout));
    // AT_FDCWD, read as the int it is.
    assert_eq!(open["dfd"], -100, "{open}");
}

/// A SIGUSR1 report shows what is counted so far without clearing it, so
/// the next report shows it again: the summary's events are what the
/// reports that cleared showed, not that plus the SIGUSR1 snapshot (count
/// said 18,478 against 10,761 shown), in count and in brkstack alike.
#[test]
fn usr1_reports_do_not_change_the_summary_total() {
    const N: u64 = 100;
    for (tool, kind) in [
        (&["count", "syscalls:sys_enter_brk"][..], "count"),
        (&["brkstack"][..], "brk_stack"),
    ] {
        let mut w = Workload::start(&["sbrk", &N.to_string(), "4096", "60000"]);
        let pid = w.pid.to_string();
        let mut args = tool.to_vec();
        args.extend_from_slice(&["-p", &pid, "--json"]);
        let mut t = Tracer::start(&args);
        w.go();
        assert_eq!(w.line().trim(), "done");
        t.signal(libc::SIGUSR1);
        // The snapshot is printed before the run is ended.
        let first = t.stdout_line(|l| l.contains(&format!("\"type\":\"{kind}\"")), WAIT);
        assert!(first.is_some(), "{tool:?}: no SIGUSR1 report");
        let out = t.interrupt();
        let _ = w.child.kill();
        let _ = w.child.wait();
        // The workload was done before the SIGUSR1: the snapshot and the
        // final report show the same counts, and the summary counts them once.
        let shown: u64 = json_of(&out.stdout, kind)
            .iter()
            .map(|r| r["count"].as_u64().unwrap())
            .sum();
        let s = &json_of(&out.stdout, "summary")[0];
        let events = s["events"].as_u64().unwrap();
        assert!(events >= N, "{tool:?}: {}", out.stdout);
        assert_eq!(shown, 2 * events, "{tool:?}: {}", out.stdout);
    }
}

/// Directories removed on drop (a test's parent groups, after the groups).
struct RemoveDirs(Vec<std::path::PathBuf>);

impl Drop for RemoveDirs {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// `--by container` and `--by pod`: two containers of one pod, named as
/// the kubelet's cgroupfs driver names them; each container's calls under
/// its id, the pod's under its uid, its groups' counts added.
#[test]
fn counts_by_container_and_by_pod_add_up_their_groups() {
    let test = "counts_by_container_and_by_pod_add_up_their_groups";
    let Some((root, _)) = memcg_root() else {
        return skip(test, "no memory cgroup controller");
    };
    let me = std::process::id();
    let uid = format!("5e0c5d3e-7f2a-4b6c-9d8e-{me:012x}");
    let top = format!("kubepods-memtrace-{me}");
    let pod = format!("{top}/pod{uid}");
    let ids = [1, 2].map(|n| format!("{n}{me:063x}"));
    let _parents = RemoveDirs(vec![root.join(&pod), root.join(&top)]);
    let a = Memcg::named(&format!("{pod}/{}", ids[0]), "1G", false);
    let b = Memcg::named(&format!("{pod}/{}", ids[1]), "1G", false);
    let w = workload_bin().display().to_string();
    let cmd = format!(
        "sh -c 'echo $$ > {}/cgroup.procs && {w} madvise 10 4096 && echo $$ > {}/cgroup.procs && {w} madvise 15 4096'",
        a.path.display(),
        b.path.display()
    );
    let short = |id: &str| id[..12].to_string();
    for (by, col, want) in [
        (
            "container,comm",
            "container",
            vec![(short(&ids[0]), 10), (short(&ids[1]), 15)],
        ),
        ("pod,comm", "pod", vec![(uid.clone(), 25)]),
    ] {
        let out = run(&[
            "count",
            "syscalls:sys_enter_madvise",
            "--by",
            by,
            "--json",
            "-c",
            &cmd,
        ]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let mut got: Vec<(String, u64)> = counts(&out.stdout)
            .iter()
            .filter(|r| r["comm"] == "memtrace-worklo")
            .map(|r| {
                let key = r[col].as_str().unwrap().to_string();
                (key, r["count"].as_u64().unwrap())
            })
            .collect();
        got.sort();
        assert_eq!(got, want, "--by {by}: {}", out.stdout);
    }
}
