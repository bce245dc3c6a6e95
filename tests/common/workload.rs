//! The workload binary (tests/workload), started with --wait so that only
//! its counted work comes after memtrace is attached.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::Duration;

use super::{lines_of, read_all, wait_child, Tracer, WAIT};

pub fn workload_bin() -> PathBuf {
    super::built("MEMTRACE_WORKLOAD", "memtrace-workload")
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
        Self::start_from(workload_bin().as_os_str(), args, f)
    }

    /// The workload run from another copy of its binary.
    pub fn start_from(
        bin: &std::ffi::OsStr,
        args: &[&str],
        f: impl FnOnce(&mut Command),
    ) -> Workload {
        let mut c = Command::new(bin);
        c.arg("--wait").args(args);
        f(&mut c);
        Self::spawn(c)
    }

    /// The workload as `c` runs it (a wrapper that ends by exec'ing it with
    /// --wait: its pid is the wrapper's).
    pub fn spawn(mut c: Command) -> Workload {
        c.stdin(Stdio::piped()).stdout(Stdio::piped());
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

    /// A line to its stdin, which stays open (a workload that waits for
    /// more than one go-ahead); `go` sends the last.
    pub fn send(&mut self, line: &str) {
        let s = self.stdin.as_mut().unwrap();
        s.write_all(format!("{line}\n").as_bytes()).unwrap();
        s.flush().unwrap();
    }

    /// The next line it prints (a handshake: "done").
    pub fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line
    }

    /// Waits for it to exit (within WAIT).
    pub fn wait(mut self) -> ExitStatus {
        wait_child(&mut self.child, WAIT)
    }

    /// Waits for it to exit (within WAIT); returns what it printed after its pid.
    pub fn wait_output(self) -> (ExitStatus, String) {
        let Workload {
            mut child, stdout, ..
        } = self;
        let out = read_all(stdout);
        let st = wait_child(&mut child, WAIT);
        (st, out.join().unwrap())
    }
}

/// Traces workload `work` (started with --wait) with each of `tracers`
/// (memtrace arguments, `-p PID --json` added) at once, each of which must
/// succeed; their stdouts.
pub fn trace_workload(work: &[&str], tracers: &[&[&str]]) -> Vec<String> {
    let mut w = Workload::start(work);
    let pid = w.pid.to_string();
    let running: Vec<Tracer> = tracers
        .iter()
        .map(|a| {
            let mut args = a.to_vec();
            args.extend(["-p", &pid, "--json"]);
            Tracer::start(&args)
        })
        .collect();
    w.go();
    assert!(w.wait().success());
    running
        .into_iter()
        .map(|t| {
            let out = t.wait(Duration::from_secs(20));
            assert_eq!(out.code, 0, "{}", out.stderr);
            out.stdout
        })
        .collect()
}

/// A test program started with `WORKLOAD_HANDSHAKE` (tests/workload/
/// handshake.h): running, its libraries loaded, and waiting for `go`
/// before its work. The handshake for tracers that attach by pid.
pub struct Paused {
    pub child: Child,
    stdin: Option<ChildStdin>,
}

impl Paused {
    pub fn start(cmd: &mut Command) -> Paused {
        let mut child = cmd
            .env("WORKLOAD_HANDSHAKE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the test program");
        let lines = lines_of(child.stdout.take().unwrap());
        match lines.recv_timeout(WAIT) {
            Ok(l) if l == "ready" => {}
            other => {
                let _ = child.kill();
                panic!("the test program did not say ready: {other:?}");
            }
        }
        // Whatever it prints later is read, so that it never blocks on a
        // full pipe.
        std::thread::spawn(move || lines.iter().for_each(drop));
        let stdin = child.stdin.take();
        Paused { child, stdin }
    }

    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// Lets it do its work.
    pub fn go(&mut self) {
        let mut s = self.stdin.take().expect("go once");
        s.write_all(b"go\n").expect("the test program reads its go");
    }
}
