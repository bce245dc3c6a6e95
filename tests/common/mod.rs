//! Helpers for tests that run the real memtrace binary against workloads.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub fn memtrace_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_memtrace"))
}

pub fn workload_bin() -> PathBuf {
    let p = std::env::var_os("MEMTRACE_WORKLOAD")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/memtrace-workload")
        });
    assert!(
        p.exists(),
        "workload binary {} missing: run `cargo xtask test`",
        p.display()
    );
    p
}

pub struct Output {
    pub stdout: String,
    pub stderr: String,
    pub code: i32,
}

/// memtrace running in the background, attached once `start` returns.
pub struct Tracer {
    child: Child,
    stderr: mpsc::Receiver<String>,
    pub early_stderr: String,
    /// stdout lines as they come, once `stdout_line` has been used.
    stdout: Option<mpsc::Receiver<String>>,
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
            stdout: None,
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
        if self.stdout.is_none() {
            let (tx, rx) = mpsc::channel();
            let out = self.child.stdout.take().unwrap();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            self.stdout = Some(rx);
        }
        let rx = self.stdout.as_ref().unwrap();
        let deadline = Instant::now() + timeout;
        while let Ok(l) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            self.seen_stdout.push_str(&l);
            self.seen_stdout.push('\n');
            if pred(&l) {
                return Some(l);
            }
        }
        None
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
                match &self.stdout {
                    Some(rx) => {
                        while let Ok(l) = rx.recv_timeout(Duration::from_secs(2)) {
                            stdout.push_str(&l);
                            stdout.push('\n');
                        }
                    }
                    None => {
                        self.child
                            .stdout
                            .take()
                            .unwrap()
                            .read_to_string(&mut stdout)
                            .unwrap();
                    }
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

/// Runs memtrace to completion.
pub fn run(args: &[&str]) -> Output {
    let o = Command::new(memtrace_bin())
        .args(args)
        .output()
        .expect("run memtrace");
    Output {
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        code: o.status.code().unwrap_or(-1),
    }
}

/// A workload started with --wait: it has printed its pid and waits for `go`.
pub struct Workload {
    pub child: Child,
    pub pid: u32,
    stdin: Option<ChildStdin>,
    /// The rest of its stdout, kept open so that what it prints after `go` can be read.
    stdout: BufReader<std::process::ChildStdout>,
}

impl Workload {
    pub fn start(args: &[&str]) -> Workload {
        Self::start_with(args, |_| {})
    }

    pub fn start_with(args: &[&str], f: impl FnOnce(&mut Command)) -> Workload {
        let mut c = Command::new(workload_bin());
        c.arg("--wait")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        f(&mut c);
        let mut child = c.spawn().expect("spawn workload");
        let mut line = String::new();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut line).unwrap();
        let pid = line.trim().parse().expect("workload pid");
        let stdin = child.stdin.take();
        Workload {
            child,
            pid,
            stdin,
            stdout,
        }
    }

    pub fn go(&mut self) {
        let mut s = self.stdin.take().unwrap();
        s.write_all(b"go\n").unwrap();
    }

    pub fn wait(mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }

    /// Waits for it to exit and returns what it printed after its pid.
    pub fn wait_output(mut self) -> (std::process::ExitStatus, String) {
        let mut out = String::new();
        self.stdout.read_to_string(&mut out).unwrap();
        (self.child.wait().unwrap(), out)
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

/// JSON lines of a given "type".
/// The user frames of a stack record (`user_stack`), innermost first.
pub fn user_frames(v: &serde_json::Value) -> Vec<String> {
    v["user_stack"]
        .as_array()
        .unwrap_or_else(|| panic!("no user_stack: {v}"))
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect()
}

pub fn json_of(stdout: &str, ty: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["type"] == ty)
        .collect()
}

/// A v1 memory cgroup with a limit, removed on drop.
pub struct Memcg {
    pub path: PathBuf,
    pub name: String,
}

impl Memcg {
    pub fn new(tag: &str, limit: &str) -> Memcg {
        let name = format!("memtrace-test-{tag}-{}", std::process::id());
        let path = PathBuf::from("/sys/fs/cgroup/memory").join(&name);
        std::fs::create_dir_all(&path).expect("create memcg (cgroup v1 memory controller)");
        std::fs::write(path.join("memory.limit_in_bytes"), limit).unwrap();
        let _ = std::fs::write(path.join("memory.memsw.limit_in_bytes"), limit);
        Memcg { path, name }
    }

    /// A command that joins this cgroup before it execs.
    pub fn command(&self, program: &std::path::Path) -> Command {
        use std::os::unix::process::CommandExt;
        let procs = self.path.join("cgroup.procs");
        let mut c = Command::new(program);
        unsafe {
            c.pre_exec(move || {
                std::fs::write(&procs, format!("{}", std::process::id()))?;
                Ok(())
            });
        }
        c
    }
}

impl Drop for Memcg {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.path).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
