//! What an incident tool meets besides the kernel: readers that go away,
//! full disks, hostile process names, missing privileges.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;

/// memtrace with the given stdout, once it says "Tracing"; its stderr
/// lines keep coming through the receiver.
fn spawn_with_stdout(args: &[&str], stdout: Stdio) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(memtrace_bin())
        .args(args)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn memtrace");
    let (tx, rx) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) if l.starts_with("Tracing") => return (child, rx),
            Ok(_) => {}
            Err(_) => {
                let _ = child.kill();
                panic!("memtrace {args:?} did not start");
            }
        }
    }
}

/// Waits up to `timeout` for `child` to exit, running `mmap-loop` workloads
/// meanwhile so that memtrace has something to write; its exit code.
fn wait_making_mmaps(child: &mut Child, timeout: Duration) -> Option<i32> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(st) = child.try_wait().unwrap() {
            return st.code();
        }
        let st = Command::new(workload_bin())
            .args(["mmap-loop", "1", "500"])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success());
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn rest(rx: &mpsc::Receiver<String>) -> String {
    let mut s = String::new();
    while let Ok(l) = rx.recv_timeout(Duration::from_secs(2)) {
        s.push_str(&l);
        s.push('\n');
    }
    s
}

#[test]
fn a_reader_that_goes_away_ends_memtrace_quietly_and_detached() {
    let before = settled_programs();
    let (mut child, err) = spawn_with_stdout(&["mmapsnoop", "--json"], Stdio::piped());
    assert!(loaded_programs() > before, "nothing loaded while tracing");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    // Calls of our own, so that a line comes.
    Command::new(workload_bin())
        .args(["mmap-loop", "1", "10"])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert!(first.starts_with('{'), "first line: {first:?}");
    // `head -1`: the reader closes its end after one line.
    drop(out);
    let code = wait_making_mmaps(&mut child, Duration::from_secs(5));
    let stderr = rest(&err);
    assert_eq!(code, Some(0), "did not end quietly in 5 s: {stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_programs_back_to(before);
}

#[test]
fn a_full_device_is_one_error_line_and_exit_1() {
    let full = std::fs::File::create("/dev/full").unwrap();
    let (mut child, err) = spawn_with_stdout(&["mmapsnoop", "-d", "2"], full.into());
    let code = wait_making_mmaps(&mut child, Duration::from_secs(10));
    let stderr = rest(&err);
    assert_eq!(code, Some(1), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].starts_with("memtrace: error: writing output: ")
            && errors[0].contains("No space left on device"),
        "{stderr}"
    );
    // Nothing reached the output: no summary claims otherwise.
    assert!(!stderr.contains("memtrace mmapsnoop:"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn doctor_into_a_full_device_does_not_panic() {
    let full = std::fs::File::create("/dev/full").unwrap();
    let o = Command::new(memtrace_bin())
        .arg("doctor")
        .stdout(full)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].starts_with("memtrace: error: writing output: "),
        "{stderr}"
    );
}

#[test]
fn stderr_and_stdout_into_a_closed_pipe_do_not_panic() {
    // `memtrace faults -d 1 2>&1 | head -1`
    let (r, w) = std::io::pipe().unwrap();
    let mut child = Command::new(memtrace_bin())
        .args(["faults", "-d", "1"])
        .stdout(w.try_clone().unwrap())
        .stderr(w)
        .spawn()
        .unwrap();
    let mut r = BufReader::new(r);
    let mut first = String::new();
    r.read_line(&mut first).unwrap();
    assert!(!first.is_empty());
    drop(r);
    let deadline = Instant::now() + Duration::from_secs(20);
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "memtrace did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    // 101 is a panic.
    assert_eq!(st.code(), Some(0));
}

#[test]
fn hostile_command_names_are_escaped_in_text_output() {
    // The workload names itself "ev ESC [2J il NEWLINE name"; its child
    // touches 3000 pages under that name.
    let cmd = format!("{} badname 3000", workload_bin().display());
    let out = run(&["faults", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        !out.stdout.chars().any(|c| c.is_control() && c != '\n'),
        "raw control characters: {:?}",
        out.stdout
    );
    let escaped = r"ev\x1b[2Jil\nname";
    let row = out
        .stdout
        .lines()
        .find(|l| l.contains(escaped))
        .unwrap_or_else(|| panic!("no row for the renamed child: {}", out.stdout));
    // The whole row is one line: its counts follow the name.
    let nums: Vec<u64> = row
        .split_whitespace()
        .rev()
        .take(3)
        .map(|w| w.parse().unwrap())
        .collect();
    assert!(nums[2] >= 3000, "user faults {row}");
    // No line was forged out of the name's second half.
    assert!(
        !out.stdout.lines().any(|l| l.starts_with("name")),
        "{}",
        out.stdout
    );
}

/// `memtrace faults -d 1` as root without the capabilities `dropped` (a
/// setpriv `--bounding-set`): its exit status and stderr.
fn faults_without(dropped: &str) -> (Option<i32>, String) {
    let o = Command::new("setpriv")
        .args(["--inh-caps=-all", &format!("--bounding-set={dropped}")])
        .arg(memtrace_bin())
        .args(["faults", "-d", "1"])
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn missing_capabilities_are_named_and_exit_2() {
    // Root, but without the capabilities that load and attach programs.
    if Command::new("setpriv").arg("--version").output().is_err() {
        skip("hardening", "setpriv (util-linux) is not installed");
        return;
    }
    let before = settled_programs();
    let (code, stderr) = faults_without("-bpf,-perfmon,-sys_admin");
    assert_eq!(code, Some(2), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("memtrace: error: "), "{stderr}");
    assert!(
        lines[0].contains("missing CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)"),
        "{stderr}"
    );
    assert_programs_back_to(before);

    // Without CAP_PERFMON alone, that is what it names.
    let (code, stderr) = faults_without("-perfmon,-sys_admin");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("missing CAP_PERFMON (or CAP_SYS_ADMIN)")
            && !stderr.contains("missing CAP_BPF"),
        "{stderr}"
    );
}

#[test]
fn a_full_ring_buffer_warns_with_buffer_size_advice() {
    let (mut child, err) = spawn_with_stdout(
        &["mmapsnoop", "--json", "--buffer-size", "8K"],
        Stdio::null(),
    );
    let st = Command::new(workload_bin())
        .args(["mmap-loop", "2", "50000"])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    // The warning comes from the 250 ms housekeeping tick: memtrace is
    // stopped once it has said it.
    let mut stderr = String::new();
    first_line(&err, &mut stderr, |l| l.contains("lost so far"), WAIT);
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let st = child.wait().unwrap();
    stderr.push_str(&rest(&err));
    assert_eq!(st.code(), Some(0), "{stderr}");
    let w = stderr
        .lines()
        .find(|l| l.starts_with("memtrace: warning:") && l.contains("lost so far"))
        .unwrap_or_else(|| panic!("no loss warning: {stderr}"));
    assert!(
        w.contains("ringbuf_full=") && w.contains("a bigger --buffer-size"),
        "{w}"
    );
}

#[test]
fn timestamps_on_mmapsnoop_show_one_time_column() {
    let (mut child, err) = spawn_with_stdout(&["mmapsnoop", "-T", "-d", "2"], Stdio::piped());
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut BufReader::new(stdout), &mut s).unwrap();
        s
    });
    let code = wait_making_mmaps(&mut child, Duration::from_secs(10));
    let stdout = reader.join().unwrap();
    assert_eq!(code, Some(0), "{}", rest(&err));
    let mut lines = stdout.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert_eq!(header[..3], ["TIME", "PID", "COMM"], "{stdout}");
    let row: Vec<&str> = lines.next().expect("no event").split_whitespace().collect();
    let time = row[0].as_bytes();
    assert!(
        time.len() == 8 && time[2] == b':' && time[5] == b':',
        "{row:?}"
    );
    assert!(
        row[1].parse::<u32>().is_ok(),
        "second column is not a pid: {row:?}"
    );
}

#[test]
fn a_binary_path_that_is_not_utf8_still_symbolizes() {
    use std::os::unix::ffi::OsStrExt;
    // A copy of the workload in a directory whose name is not UTF-8.
    let dir = std::env::temp_dir().join(std::ffi::OsStr::from_bytes(
        format!("memtrace-caf\u{e9}-{}", std::process::id()).as_bytes(),
    ));
    let mut raw = dir.as_os_str().as_bytes().to_vec();
    let at = raw.iter().position(|&b| b == 0xc3).unwrap();
    raw.splice(at..at + 2, [0xe9]);
    let dir = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&raw));
    // The loop's 30 calls and the brk(0) before them.
    assert_eq!(brk_calls_named_in_a_copy_at(&dir), 31);
}

/// brkstack -p on a copy of the workload in `dir` (removed after): its
/// brk calls whose innermost frame names the function that makes them.
fn brk_calls_named_in_a_copy_at(dir: &std::path::Path) -> u64 {
    std::fs::create_dir_all(dir).unwrap();
    let bin = dir.join("workload");
    std::fs::copy(workload_bin(), &bin).unwrap();
    let mut w = Workload::start_from(bin.as_os_str(), &["rawbrk", "30", "4096", "300"], |_| {});
    let pid = w.pid.to_string();
    let t = Tracer::start(&["brkstack", "-p", &pid, "--json", "--stack-mode", "fp"]);
    w.go();
    assert!(w.wait().success());
    let out = t.wait(Duration::from_secs(20));
    std::fs::remove_dir_all(dir).unwrap();
    assert_eq!(out.code, 0, "{}", out.stderr);
    json_of(&out.stdout, "brk_stack")
        .iter()
        .filter(|s| user_frames(s)[0].contains("grow_heap_with_raw_brk"))
        .map(|s| s["count"].as_u64().unwrap())
        .sum::<u64>()
}

/// Not root, with CAP_BPF and CAP_PERFMON only: tracefs (root's, 0700)
/// cannot be read, and the one line says who cannot read it and the ways
/// to let memtrace in, one of which (CAP_DAC_READ_SEARCH) then works.
#[test]
fn an_unreadable_tracefs_names_the_fixes() {
    use std::os::unix::fs::MetadataExt;
    let readable =
        std::fs::metadata("/sys/kernel/tracing").is_ok_and(|m| m.mode() & 0o005 == 0o005);
    if Command::new("setpriv").arg("--version").output().is_err() || readable {
        skip(
            "an_unreadable_tracefs_names_the_fixes",
            "needs setpriv and a tracefs others cannot read",
        );
        return;
    }
    let as_nobody = |caps: &str| {
        let o = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args([
                format!("--inh-caps={caps}"),
                format!("--ambient-caps={caps}"),
            ])
            .arg(memtrace_bin())
            .args(["faults", "-d", "300ms"])
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, stderr) = as_nobody("+bpf,+perfmon");
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    for says in [
        "uid 65534 cannot read it",
        "CAP_DAC_READ_SEARCH",
        "mode=0755",
    ] {
        assert!(stderr.contains(says), "{says}: {stderr}");
    }
    let (code, stderr) = as_nobody("+bpf,+perfmon,+dac_read_search");
    assert_eq!(code, Some(0), "{stderr}");
}

/// A binary in a directory whose name holds a newline symbolizes under
/// `-p`: /proc/PID/maps writes the newline as `\012`, and the file was
/// looked for under that name (its frames were bare offsets).
#[test]
fn a_binary_path_with_a_newline_still_symbolizes() {
    let dir = std::env::temp_dir().join(format!("memtrace-new\nline-{}", std::process::id()));
    // The loop's 30 calls and the brk(0) before them.
    assert_eq!(brk_calls_named_in_a_copy_at(&dir), 31);
}

/// doctor says whether systemd-oomd here calls prekill hooks (`memcg
/// --prekill`): the systemd version read apart from memtrace.
#[test]
fn doctor_says_whether_oomd_calls_prekill_hooks_here() {
    let o = Command::new(memtrace_bin()).arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let row = text
        .lines()
        .find(|l| l.starts_with("oomd prekill hook"))
        .unwrap_or_else(|| panic!("no prekill row: {text}"));
    let version = Command::new("systemctl")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            let t = String::from_utf8_lossy(&o.stdout).into_owned();
            t.split_whitespace().nth(1)?.parse::<u32>().ok()
        });
    match version {
        None => assert!(row.contains(" no ") && row.contains("no systemd"), "{row}"),
        Some(v) if v < 260 => {
            assert!(
                row.contains(" no ") && row.contains(&format!("systemd {v} here")),
                "{row}"
            )
        }
        Some(v) => assert!(row.contains(&format!("systemd {v}")), "{row}"),
    }
}
