//! `cargo xtask soak [MINUTES]`: memtrace's long-run behaviour. The tools
//! that keep state per process and per stack run side by side against a
//! churning workload (processes started one after another, each faulting,
//! growing its heap and exiting; a loop of short malloc/free runs for
//! memleak), and every minute each one's events, losses, resident memory
//! and CPU are printed, then the final summaries.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::target_dir;

struct Run {
    name: &'static str,
    child: Child,
    /// The latest `--progress` line.
    progress: Arc<Mutex<String>>,
    /// CPU ticks at the last report.
    ticks: u64,
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the command name, which may hold spaces: utime, stime
    // are the 12th and 13th of them.
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    n(11) + n(12)
}

/// Processes the host has started since boot (`processes` in /proc/stat):
/// the churn's rate, which pids (wrapping at pid_max) cannot tell.
fn forks() -> u64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("processes "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Kernel memory of the BPF maps `pid` holds open (the `memlock` of each
/// map descriptor's fdinfo): kept apart from its RSS, which counts a map
/// only while it is mapped.
fn maps_kib(pid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return 0;
    };
    let mut bytes = 0;
    for e in dir.flatten() {
        let Ok(info) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        if !info.contains("map_type:") {
            continue;
        }
        bytes += info
            .lines()
            .find_map(|l| l.strip_prefix("memlock:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    bytes / 1024
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn start(name: &'static str, bin: &std::path::Path, args: &[String]) -> Result<Run> {
    let out = target_dir().join("soak").join(format!("{name}.json"));
    let mut child = Command::new(bin)
        .args(args)
        .args(["--json", "--progress", "60s", "--output"])
        .arg(&out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting memtrace {name}"))?;
    let progress = Arc::new(Mutex::new(String::new()));
    let p = progress.clone();
    let err = child.stderr.take().expect("piped");
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(|l| l.ok()) {
            if let Some(rest) = l.strip_prefix("memtrace: progress: ") {
                *p.lock().unwrap() = rest.to_string();
            } else if l.contains("warning") || l.contains("error") {
                eprintln!("  [{name}] {l}");
            }
        }
    });
    Ok(Run {
        name,
        child,
        progress,
        ticks: 0,
    })
}

pub fn run(minutes: u64) -> Result<()> {
    if minutes == 0 {
        bail!("soak: MINUTES must be at least 1");
    }
    let bin = target_dir().join("release/memtrace");
    let w = target_dir().join("release/memtrace-workload");
    std::fs::create_dir_all(target_dir().join("soak"))?;
    let w = w.display();
    // A new process every few milliseconds, each with fresh stacks.
    let churn = format!("while :; do {w} touch 50; {w} sbrk 5 8192; /bin/true; done");
    let mut churner = Command::new("sh").args(["-c", &churn]).spawn()?;
    let cpid = churner.id().to_string();
    let leaks = format!("while :; do {w} malloc-loop 20000 >/dev/null; sleep 0.2; done");
    let d = format!("{minutes}m");
    let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let mut runs = [
        start("faults", &bin, &s(&["faults", "-d", &d]))?,
        start("faults-stacks", &bin, &s(&["faults", "--stacks", "-d", &d]))?,
        start("brkstack", &bin, &s(&["brkstack", "-d", &d]))?,
        start(
            "rss-children",
            &bin,
            &s(&["rss", "-p", &cpid, "--children", "-d", &d]),
        )?,
        start("memleak", &bin, &s(&["memleak", "-c", &leaks, "-d", &d]))?,
    ];
    let hz = 100.0; // USER_HZ on Linux
    let began = Instant::now();
    let mut forked = forks();
    println!(
        "xtask: soak: {minutes} min; every minute: events, lost, RSS, kernel memory of its BPF maps, CPU of each tool"
    );
    for minute in 1..=minutes {
        std::thread::sleep(
            Duration::from_secs(60).saturating_sub(
                began
                    .elapsed()
                    .saturating_sub(Duration::from_secs(60 * (minute - 1))),
            ),
        );
        // The progress lines come once a minute too: let the latest land.
        std::thread::sleep(Duration::from_secs(1));
        let now = forks();
        println!(
            "  {minute:>3} min  churn: {} new processes a second (host)",
            now.saturating_sub(forked) / 60
        );
        forked = now;
        for r in runs.iter_mut() {
            let pid = r.child.id();
            let t = cpu_ticks(pid);
            let cpu = (t - r.ticks.min(t)) as f64 / hz / 60.0 * 100.0;
            r.ticks = t;
            println!(
                "  {minute:>3} min  {:<14} {:<44} RSS {:>7} KiB  maps {:>7} KiB  CPU {cpu:>5.1}%",
                r.name,
                r.progress.lock().unwrap(),
                rss_kib(pid),
                maps_kib(pid)
            );
        }
    }
    let _ = churner.kill();
    let _ = churner.wait();
    println!("xtask: soak: summaries");
    for r in runs.iter_mut() {
        let st = r.child.wait()?;
        let out = target_dir().join("soak").join(format!("{}.json", r.name));
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        let summary = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["type"] == "summary");
        match summary {
            Some(v) => println!(
                "  {:<14} exit {:?}  {} events, lost {}",
                r.name,
                st.code(),
                v["events"],
                v["lost"]
            ),
            None => println!(
                "  {:<14} exit {:?}  no summary in {}",
                r.name,
                st.code(),
                out.display()
            ),
        }
    }
    Ok(())
}
