//! Helpers for tests that run the real memtrace binary against workloads.
//! Every wait on memtrace or on a child has a timeout: a test fails, never
//! hangs, whatever the host offers.
#![allow(dead_code)]

mod host;
pub mod nofp;
mod workload;
#[allow(unused_imports)]
pub use host::*;
#[allow(unused_imports)]
pub use workload::*;

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub fn memtrace_bin() -> PathBuf {
    built("MEMTRACE_BIN", "memtrace")
}

/// A binary of the workspace: `var` names it, or else it is beside this
/// test's (`target/release/deps/TEST-HASH` is built with
/// `target/release/NAME`). The tests are a package of their own, which
/// cargo does not give the others' paths.
pub fn built(var: &str, name: &str) -> PathBuf {
    let p = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        let me = std::env::current_exe().expect("the test binary's own path");
        me.parent()
            .and_then(|deps| deps.parent())
            .expect("a test binary lives in target/PROFILE/deps")
            .join(name)
    });
    assert!(
        p.exists(),
        "{name} {} missing: run `cargo xtask test`, or set {var}",
        p.display()
    );
    p
}

pub struct Output {
    pub stdout: String,
    pub stderr: String,
    pub code: i32,
}

/// The first line from `rx` matching `pred` within `timeout`; every line
/// read on the way is kept in `seen`.
pub fn first_line(
    rx: &mpsc::Receiver<String>,
    seen: &mut String,
    pred: impl Fn(&str) -> bool,
    timeout: Duration,
) -> Option<String> {
    let deadline = Instant::now() + timeout;
    while let Ok(l) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        seen.push_str(&l);
        seen.push('\n');
        if pred(&l) {
            return Some(l);
        }
    }
    None
}

/// memtrace running in the background, attached once `start` returns.
pub struct Tracer {
    child: Child,
    stderr: mpsc::Receiver<String>,
    pub early_stderr: String,
    /// stdout lines as they come, read from the start so that memtrace
    /// never blocks on a full pipe.
    stdout: mpsc::Receiver<String>,
    seen_stdout: String,
}

impl Tracer {
    pub fn start(args: &[&str]) -> Tracer {
        let mut child = Command::new(memtrace_bin())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn memtrace");
        let stdout = lines_of(child.stdout.take().unwrap());
        let (tx, rx) = mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut early = String::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) => {
                    early.push_str(&l);
                    early.push('\n');
                    if l.starts_with("Tracing") {
                        break;
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    panic!("memtrace {args:?} did not start: {early}");
                }
            }
        }
        Tracer {
            child,
            stderr: rx,
            early_stderr: early,
            stdout,
            seen_stdout: String::new(),
        }
    }

    /// The first stdout line matching `pred` printed within `timeout`, while
    /// memtrace keeps running.
    pub fn stdout_line(
        &mut self,
        pred: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Option<String> {
        first_line(&self.stdout, &mut self.seen_stdout, pred, timeout)
    }

    /// The first stderr line matching `pred` printed within `timeout` (kept
    /// in what `wait` returns).
    pub fn stderr_line(
        &mut self,
        pred: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Option<String> {
        first_line(&self.stderr, &mut self.early_stderr, pred, timeout)
    }

    /// The first JSON record of type `ty` matching `pred` printed within
    /// `timeout`: the handshake that memtrace has reported an event, in
    /// place of a sleep before stopping it. Panics after the timeout.
    pub fn record(
        &mut self,
        ty: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
        timeout: Duration,
    ) -> serde_json::Value {
        let line = self.stdout_line(
            |l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .is_ok_and(|v| v["type"] == ty && pred(&v))
            },
            timeout,
        );
        let line = line.unwrap_or_else(|| {
            panic!(
                "no {ty} record within {timeout:?}; stdout so far:\n{}",
                self.seen_stdout
            )
        });
        serde_json::from_str(&line).unwrap()
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Waits for memtrace to exit by itself (within `timeout`).
    pub fn wait(mut self, timeout: Duration) -> Output {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                let mut stdout = std::mem::take(&mut self.seen_stdout);
                // The reader thread ends with the pipe.
                while let Ok(l) = self.stdout.recv_timeout(Duration::from_secs(2)) {
                    stdout.push_str(&l);
                    stdout.push('\n');
                }
                let mut stderr = self.early_stderr.clone();
                // The reader thread ends with the pipe.
                while let Ok(l) = self.stderr.recv_timeout(Duration::from_secs(2)) {
                    stderr.push_str(&l);
                    stderr.push('\n');
                }
                return Output {
                    stdout,
                    stderr,
                    code: st.code().unwrap_or(-1),
                };
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let mut stderr = self.early_stderr.clone();
                while let Ok(l) = self.stderr.recv_timeout(Duration::from_millis(500)) {
                    stderr.push_str(&l);
                    stderr.push('\n');
                }
                panic!("memtrace did not exit in {timeout:?}; stderr: {stderr}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Ctrl-C, then wait for the summary.
    pub fn interrupt(self) -> Output {
        self.signal(libc::SIGINT);
        self.wait(Duration::from_secs(20))
    }
}

impl Drop for Tracer {
    /// A failed assertion must not leave memtrace attached for the next test.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// How long a test waits for a workload or for memtrace by default.
pub const WAIT: Duration = Duration::from_secs(60);

/// Waits for `child` to exit within `timeout`; past it, kills it and panics.
pub fn wait_child(child: &mut Child, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().expect("wait for a child") {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process {} did not exit in {timeout:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Lines read from `r` by a thread, to be taken with a timeout.
pub fn lines_of(r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// All of `r`, read by a thread until it ends.
pub fn read_all(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// Runs memtrace to completion (within WAIT).
pub fn run(args: &[&str]) -> Output {
    run_with(args, WAIT)
}

/// Runs memtrace to completion within `timeout`.
pub fn run_with(args: &[&str], timeout: Duration) -> Output {
    let mut child = Command::new(memtrace_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run memtrace");
    let out = read_all(child.stdout.take().unwrap());
    let err = read_all(child.stderr.take().unwrap());
    let st = wait_child(&mut child, timeout);
    Output {
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        code: st.code().unwrap_or(-1),
    }
}

/// Number of BPF programs loaded in the kernel right now.
pub fn loaded_programs() -> usize {
    // BPF_PROG_GET_NEXT_ID needs no fd per program, so it counts every one.
    const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
    let mut attr = [0u32; 32];
    let mut n = 0;
    loop {
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_GET_NEXT_ID,
                attr.as_mut_ptr(),
                std::mem::size_of_val(&attr),
            )
        };
        if r != 0 {
            return n;
        }
        // attr.start_id = attr.next_id
        attr[0] = attr[1];
        n += 1;
    }
}

/// The user frames of a stack record (`user_stack`), innermost first.
pub fn user_frames(v: &serde_json::Value) -> Vec<String> {
    v["user_stack"]
        .as_array()
        .unwrap_or_else(|| panic!("no user_stack: {v}"))
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect()
}

/// memleak's outstanding (allocations, bytes) of the stacks whose
/// innermost user frame is in `func`.
pub fn held(rows: &[serde_json::Value], func: &str) -> (u64, u64) {
    rows.iter()
        .filter(|r| user_frames(r).first().is_some_and(|f| f.contains(func)))
        .fold((0, 0), |(n, b), r| {
            (
                n + r["count"].as_u64().unwrap(),
                b + r["bytes"].as_u64().unwrap(),
            )
        })
}

/// JSON lines of a given "type".
pub fn json_of(stdout: &str, ty: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["type"] == ty)
        .collect()
}

/// The count once programs of earlier processes are freed (the kernel frees
/// them after an RCU grace period, not at once).
pub fn settled_programs() -> usize {
    let mut last = loaded_programs();
    for _ in 0..25 {
        std::thread::sleep(Duration::from_millis(200));
        let now = loaded_programs();
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

/// Other tests are serial (--test-threads=1), but other tools on the host may
/// load programs; retry the comparison a few times.
pub fn assert_programs_back_to(before: usize) {
    for _ in 0..20 {
        // Fewer is fine: programs of an earlier test may still be freed (RCU).
        if loaded_programs() <= before {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "BPF programs before: {before}, after: {}",
        loaded_programs()
    );
}

/// The event counts of a run's `--progress` lines, in order.
pub fn progress_counts(stderr: &str) -> Vec<u64> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("memtrace: progress: "))
        .filter_map(|l| l.split(", ").nth(1)?.strip_suffix(" events")?.parse().ok())
        .collect()
}

/// A fresh directory for one test, named by the test file's `kind` and the
/// test's `name`.
pub fn scratch_dir(kind: &str, name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("memtrace-{kind}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A library of the tests' to dlopen while memtrace runs
/// (tests/workload/late/late.c, `late_leak(k, size)`; workload `late-lib`).
pub fn late_lib() -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("workload/late/late.c");
    nofp::build(
        "liblate.so",
        Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-fno-omit-frame-pointer"])
            .arg(src),
    )
}
