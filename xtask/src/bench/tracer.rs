//! Starting and stopping the tracers, and running the workload timed.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::target_dir;

pub(super) fn memtrace() -> String {
    target_dir().join("release/memtrace").display().to_string()
}

pub(super) fn workload() -> String {
    target_dir()
        .join("release/memtrace-workload")
        .display()
        .to_string()
}

pub(super) fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

pub(super) fn ensure_peers() {
    if !have("bpftrace") || !have("oomkill-bpfcc") || !have("drsnoop") {
        eprintln!("bench: installing the peer tools with apt: bpftrace bpfcc-tools libbpf-tools");
        let _ = Command::new("sh")
            .args(["-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bpftrace bpfcc-tools libbpf-tools"])
            .status();
    }
}

/// A tracer started and attached (its "ready" line seen), to be stopped by SIGINT.
pub(super) struct Tracer {
    pub(super) child: Child,
    pub(super) startup: Duration,
}

pub(super) fn start(argv: &[String], ready: &str) -> Result<Tracer> {
    let t0 = Instant::now();
    let mut child = Command::new("/usr/bin/time")
        .arg("-f")
        .arg("maxrss_kb %M")
        .args(argv)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("{argv:?}"))?;
    // bpftrace says "Attaching N probes..." on stdout, memtrace "Tracing" on stderr.
    let (tx, rx) = std::sync::mpsc::channel();
    // Once the tracer is ready, what it prints is thrown away as cheaply as
    // /dev/null would take it: line handling here would compete with the
    // workload for the CPUs.
    let ready_seen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for pipe in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        let ready_seen = ready_seen.clone();
        std::thread::spawn(move || {
            let mut r = BufReader::new(pipe);
            let mut line = String::new();
            while !ready_seen.load(std::sync::atomic::Ordering::Relaxed) {
                line.clear();
                match r.read_line(&mut line) {
                    Ok(n) if n > 0 => {
                        let _ = tx.send(line.trim_end().to_string());
                    }
                    _ => return,
                }
            }
            let _ = std::io::copy(&mut r, &mut std::io::sink());
        });
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(l) if l.contains(ready) => break,
            Ok(l) => {
                if !l.trim().is_empty()
                    && !l.starts_with("maxrss_kb")
                    && !l.starts_with("Command exited")
                {
                    last = l;
                }
            }
            Err(_) => {
                // A tool that cannot attach here exits: say why, in its words.
                let exited = child.try_wait().ok().flatten().is_some();
                if exited || Instant::now() > deadline {
                    while let Ok(l) = rx.try_recv() {
                        if !l.trim().is_empty()
                            && !l.starts_with("maxrss_kb")
                            && !l.starts_with("Command exited")
                        {
                            last = l;
                        }
                    }
                    let _ = child.kill();
                    let why = if last.is_empty() {
                        "no output".to_string()
                    } else {
                        last
                    };
                    bail!("{}", why.replace('|', "/"));
                }
            }
        }
    }
    let startup = t0.elapsed();
    ready_seen.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(Tracer { child, startup })
}

impl Tracer {
    pub(super) fn stop(mut self) {
        // SIGINT to the tracer itself (the child of /usr/bin/time).
        let pid = self.child.id();
        let _ = Command::new("pkill")
            .args(["-INT", "-P", &pid.to_string()])
            .status();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(15) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = Command::new("pkill")
            .args(["-KILL", "-P", &pid.to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// Time of the workload's own loop, in ns.
pub(super) fn run_workload(args: &[&str]) -> Result<u64> {
    let o = Command::new(workload()).args(args).output()?;
    let s = String::from_utf8_lossy(&o.stdout);
    s.lines()
        .find_map(|l| l.strip_prefix("elapsed_ns "))
        .and_then(|v| v.trim().parse().ok())
        .context("workload printed no time")
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

pub(super) struct Config {
    pub(super) name: &'static str,
    pub(super) argv: Option<Vec<String>>,
    pub(super) ready: &'static str,
}

pub(super) fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Lets a `--wait` workload go (the line on its stdin) and reads the loop's
/// own time from its output.
pub(super) fn go_and_time(
    w: &mut Child,
    lines: impl Iterator<Item = std::io::Result<String>>,
) -> Option<f64> {
    use std::io::Write;
    let mut stdin = w.stdin.take()?;
    let _ = stdin.write_all(b"go\n");
    drop(stdin);
    let ns = lines
        .map_while(|l| l.ok())
        .find_map(|l| l.strip_prefix("elapsed_ns ")?.trim().parse().ok());
    let _ = w.wait();
    ns
}
