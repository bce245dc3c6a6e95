//! Session life cycle: nothing stays attached, bad input exits 2.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn nothing_stays_loaded_after_duration_sigint_sigterm_sighup() {
    let before = settled_programs();
    let out = run(&["faults", "-d", "300ms"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_programs_back_to(before);

    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        let t = Tracer::start(&["oomkill"]);
        // While tracing, memtrace's programs are loaded.
        assert!(
            loaded_programs() > before,
            "no program loaded while tracing"
        );
        t.signal(sig);
        let out = t.wait(Duration::from_secs(10));
        assert_eq!(out.code, 0, "signal {sig}: {}", out.stderr);
        assert!(
            out.stderr.contains("memtrace oomkill:"),
            "no summary: {}",
            out.stderr
        );
        assert_programs_back_to(before);
    }
}

#[test]
fn attach_error_exits_2_naming_missing_kprobes_and_leaves_nothing() {
    if kprobes() {
        skip(
            "attach_error_exits_2_naming_missing_kprobes_and_leaves_nothing",
            "this kernel has kprobes: oomkill --attach kprobe attaches",
        );
        return;
    }
    let before = settled_programs();
    let out = run(&["oomkill", "--attach", "kprobe"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("kprobe"), "{}", out.stderr);
    assert_eq!(
        out.stderr.trim().lines().count(),
        1,
        "one line: {}",
        out.stderr
    );
    assert_programs_back_to(before);
}

#[test]
fn bad_input_exits_2_with_one_clear_line() {
    let before = settled_programs();
    let cases: [(&[&str], &str); 9] = [
        (
            &["faults", "-p", "999999999"],
            "no process with pid 999999999",
        ),
        (&["faults", "-p", "0"], "pid must be greater than 0"),
        (&["faults", "-d", "soon"], "not a duration"),
        (&["faults", "-d", "1e30"], "not a duration"),
        (&["nosuchtool"], "unrecognized subcommand"),
        (&["faults", "--by-mapping"], "needs -p"),
        (&["faults", "--keys", "0"], "--keys"),
        (&["faults", "--bogus"], "unexpected argument"),
        (&["mmapsnoop", "--buffer-size", "2G"], "out of range"),
    ];
    for (args, want) in cases {
        let out = run(args);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(want), "{args:?}: {}", out.stderr);
        assert_eq!(
            out.stderr.trim().lines().count(),
            1,
            "{args:?}: {}",
            out.stderr
        );
        assert_programs_back_to(before);
    }
}

#[test]
fn trace_ends_when_the_target_process_exits() {
    let mut w = Workload::start(&["sleep", "300"]);
    let t = Tracer::start(&["faults", "-p", &w.pid.to_string(), "--json"]);
    w.go();
    w.wait();
    let out = t.wait(Duration::from_secs(10));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s = json_of(&out.stdout, "summary");
    assert_eq!(s.len(), 1, "{}", out.stdout);
    // Loss counters are always reported, even at zero.
    for k in ["ringbuf_full", "stack_fail", "map_full", "read_fail"] {
        assert!(s[0]["lost"][k].is_u64(), "{k} missing: {}", s[0]);
    }
}

#[test]
fn command_runs_traced_and_its_exit_status_is_reported() {
    let cmd = format!("{} exit 7", workload_bin().display());
    let out = run(&["faults", "--json", "-c", &cmd]);
    // The command's failure is the run's, as with strace.
    assert_eq!(out.code, 7, "{}", out.stderr);
    let s = json_of(&out.stdout, "summary");
    assert_eq!(s[0]["command_status"], 7, "{}", out.stdout);
    let rows = json_of(&out.stdout, "faults");
    assert!(
        rows.iter().all(|r| r["comm"] == "memtrace-worklo"),
        "{rows:?}"
    );
    assert!(!rows.is_empty());
}

/// memtrace hides kernel BTF from aya's loader in a mount namespace of its
/// own: the host's mounts must not change.
#[test]
fn the_hosts_mounts_are_left_alone() {
    let before = std::fs::read_to_string("/proc/1/mountinfo").unwrap();
    let out = run(&["faults", "-d", "0.2"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let after = std::fs::read_to_string("/proc/1/mountinfo").unwrap();
    assert!(!after.contains("/sys/kernel/btf"), "{after}");
    assert_eq!(before, after);
}

/// A run that ends before its `-c` command (here `-d`) ends the command as
/// timeout(1) does, SIGTERM first, and says so; `--keep-command` leaves it
/// running, and says so too. (The command ran on, untraced and unsaid.)
#[test]
fn a_command_outliving_the_run_is_ended_or_left_as_said() {
    let started = std::time::Instant::now();
    let out = run(&["brkstack", "-d", "1", "--json", "-c", "sleep 30"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(out.stderr.contains("ending 'sleep 30'"), "{}", out.stderr);
    let s = &json_of(&out.stdout, "summary")[0];
    assert_eq!(s["command_ended_by_memtrace"], "SIGTERM", "{s}");
    assert_eq!(s["command_status"], 128 + 15, "{s}");

    // Its output away from memtrace's pipes, which it would hold open.
    let out = run(&[
        "brkstack",
        "-d",
        "1",
        "--keep-command",
        "-c",
        "exec sleep 31.5 >/dev/null 2>&1",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stderr.contains("left running"), "{}", out.stderr);
    let left = std::process::Command::new("pkill")
        .args(["-f", "^sleep 31.5$"])
        .status()
        .unwrap();
    assert!(left.success(), "the command did not outlive the run");
}

/// Targets with nothing to trace are bad input, one line and exit 2 (they
/// were accepted and printed an empty table): an empty command, a kernel
/// thread (kthreadd is pid 2), a zombie.
#[test]
fn meaningless_targets_exit_2_with_one_line() {
    for (args, want) in [
        (&["faults", "-c", ""][..], "the command is empty"),
        (&["faults", "-c", "  "][..], "the command is empty"),
        (&["faults", "-p", "2"][..], "kernel thread"),
    ] {
        let out = run(args);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(want), "{args:?}: {}", out.stderr);
        assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    }
    // A child of ours that exited and is not waited for yet.
    let mut z = std::process::Command::new("true").spawn().unwrap();
    let stat = format!("/proc/{}/stat", z.id());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&stat).is_ok_and(|s| s.contains(") Z ")) {
        assert!(std::time::Instant::now() < deadline, "no zombie");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = run(&["faults", "-p", &z.id().to_string()]);
    let _ = z.wait();
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("zombie"), "{}", out.stderr);
    // A pid that exits while memleak sets up (its uprobes take about
    // 200 ms here), reaped at once so it is never a zombie: it had nothing
    // traced, and that is said (it was several lines of attach errors).
    let mut short = std::process::Command::new("sleep")
        .arg("0.1")
        .spawn()
        .unwrap();
    let pid = short.id().to_string();
    let reaper = std::thread::spawn(move || short.wait());
    let out = run(&["memleak", "-p", &pid]);
    let _ = reaper.join();
    assert_eq!(out.code, 2, "{}", out.stderr);
    let last = out.stderr.trim().lines().last().unwrap_or("");
    assert!(
        last.contains("exited while memtrace was setting up"),
        "{}",
        out.stderr
    );
}

/// Whether this process has CAP_SYS_RESOURCE (lowering an OOM score needs it).
fn sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    eff & (1 << 24) != 0
}

/// memtrace runs at oom_score_adj -1000 (the OOM killer it reports passes
/// it over) and says so, or says it cannot (no CAP_SYS_RESOURCE, as on
/// this project's CI host); its -c command keeps the score memtrace
/// started with; `--oom-score-adj` sets another (raising needs no
/// capability).
#[test]
fn memtrace_is_spared_by_the_oom_killer_and_its_command_is_not() {
    let ours = std::fs::read_to_string("/proc/self/oom_score_adj").unwrap();
    let ours = ours.trim();
    let report = std::env::temp_dir().join(format!("memtrace-oomadj-{}", std::process::id()));
    // $PPID in the shell is memtrace, which spawned it.
    let cmd = "cat /proc/self/oom_score_adj; cat /proc/$PPID/oom_score_adj";
    let spared = sys_resource();
    let (adj, said) = match spared {
        true => (
            "-1000",
            "oom_score_adj -1000: the OOM killer passes memtrace over",
        ),
        false => (ours, "lowering it needs CAP_SYS_RESOURCE"),
    };
    for (extra, memtrace_adj, said) in [
        (&[][..], adj, Some(said)),
        (&["--oom-score-adj", "300"][..], "300", None),
    ] {
        let mut args = vec!["faults", "-c", cmd, "--output", report.to_str().unwrap()];
        args.extend(extra);
        let out = run(&args);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let lines: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(lines, [ours, memtrace_adj], "{extra:?}: {}", out.stderr);
        if let Some(said) = said {
            assert!(out.stderr.contains(said), "{}", out.stderr);
        }
    }
    let _ = std::fs::remove_file(report);
}

/// Started with stdout closed, memtrace says the report would be lost, in
/// one line, exit 1 (it was written to nowhere, exit 0); with --output the
/// report goes to the file.
#[test]
fn a_closed_stdout_is_an_error_unless_the_report_goes_to_a_file() {
    let bin = memtrace_bin();
    let file = std::env::temp_dir().join(format!("memtrace-closed-{}", std::process::id()));
    let closed = |extra: &str| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("exec {} faults -c true {extra} >&-", bin.display()))
            .output()
            .unwrap()
    };
    let out = closed("");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("stdout is closed"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    let out = closed(&format!("--output {}", file.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let report = std::fs::read_to_string(&file).unwrap();
    assert!(report.contains("true"), "{report}");
    let _ = std::fs::remove_file(file);
}

/// A stdout that is /dev/null opened read-write (Python's
/// `subprocess.DEVNULL`, `daemon()`, a service manager) is open: memtrace
/// writes its report there and exits 0. Only a closed one is an error.
#[test]
fn a_read_write_dev_null_stdout_is_an_open_stdout() {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .unwrap();
    let out = std::process::Command::new(memtrace_bin())
        .args(["faults", "-c", "true"])
        .stdout(null)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("stdout is closed"), "{stderr}");
}
