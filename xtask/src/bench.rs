//! `cargo xtask bench`: memtrace against the peer tools on the same
//! workloads, alternating tools, medians of several runs. Writes
//! bench/RESULTS.md.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{root, target_dir};

// Runs of a second or more: at 0.1 s, this VM's jitter moved medians by
// 50-100 ns per event from one bench run to the next.
const PAGES: u64 = 1_000_000;
const BRKS: u64 = 1_000_000;
const MMAPS: u64 = 300_000;

fn memtrace() -> String {
    target_dir().join("release/memtrace").display().to_string()
}

fn workload() -> String {
    target_dir()
        .join("release/memtrace-workload")
        .display()
        .to_string()
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn ensure_peers() {
    if !have("bpftrace") || !have("oomkill-bpfcc") || !have("drsnoop") {
        eprintln!("bench: installing the peer tools with apt: bpftrace bpfcc-tools libbpf-tools");
        let _ = Command::new("sh")
            .args(["-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bpftrace bpfcc-tools libbpf-tools"])
            .status();
    }
}

/// A tracer started and attached (its "ready" line seen), to be stopped by SIGINT.
struct Tracer {
    child: Child,
    startup: Duration,
}

fn start(argv: &[String], ready: &str) -> Result<Tracer> {
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
    fn stop(mut self) {
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
fn run_workload(args: &[&str]) -> Result<u64> {
    let o = Command::new(workload()).args(args).output()?;
    let s = String::from_utf8_lossy(&o.stdout);
    s.lines()
        .find_map(|l| l.strip_prefix("elapsed_ns "))
        .and_then(|v| v.trim().parse().ok())
        .context("workload printed no time")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

struct Config {
    name: &'static str,
    argv: Option<Vec<String>>,
    ready: &'static str,
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Runs `memtrace mmapsnoop -c` on an mmap/munmap loop of `threads` threads
/// and returns (calls per second, records delivered, records reported lost).
/// One mmapsnoop run: (calls/s, delivered, reported lost, memtrace's CPU
/// seconds).
fn stream_once(threads: usize, n: usize, extra: &[&str]) -> Result<(f64, u64, u64, f64)> {
    let cmd = format!("{} mmap-loop {threads} {n}", workload());
    let mut child = Command::new("/usr/bin/time")
        .args(["-f", "cpu %U %S", &memtrace(), "mmapsnoop", "-c", &cmd])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let out = child.stdout.take().unwrap();
    // Drain stdout as fast as memtrace writes it; keep only the workload's time.
    let reader = std::thread::spawn(move || {
        let (mut ns, mut cpu_ns) = (0u64, 0u64);
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(v) = l.strip_prefix("elapsed_ns ") {
                ns = v.trim().parse().unwrap_or(0);
            } else if let Some(v) = l.strip_prefix("cpu_ns ") {
                cpu_ns = v.trim().parse().unwrap_or(0);
            }
        }
        (ns, cpu_ns)
    });
    let mut summary = String::new();
    let mut cpu = 0.0;
    for l in BufReader::new(child.stderr.take().unwrap())
        .lines()
        .map_while(Result::ok)
    {
        if l.starts_with("memtrace mmapsnoop:") {
            summary = l;
        } else if let Some(t) = l.strip_prefix("cpu ") {
            cpu = t
                .split_whitespace()
                .filter_map(|x| x.parse::<f64>().ok())
                .sum();
        }
    }
    child.wait()?;
    let (ns, workload_cpu_ns) = reader.join().unwrap();
    // time(1) counts the command memtrace ran too: what is memtrace's is the rest.
    let cpu = (cpu - workload_cpu_ns as f64 / 1e9).max(0.0);
    // "memtrace mmapsnoop: 2.1s, 800012 events, 0 lost, ..." or "N LOST (ringbuf_full=N)".
    let num_before = |word: &str| -> u64 {
        summary
            .split(", ")
            .find(|p| p.ends_with(word) || p.contains(&format!(" {word} ")))
            .and_then(|p| p.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let events = num_before("events");
    let lost = if summary.contains(" LOST") {
        num_before("LOST")
    } else {
        0
    };
    let calls = (2 * threads * n) as f64;
    Ok((calls / (ns as f64 / 1e9), events, lost, cpu))
}

/// Streaming capacity: records delivered without loss, and whether reported
/// losses match the calls made.
fn streaming(runs: usize, out: &mut String) -> Result<()> {
    out.push_str("\n### Streaming (mmapsnoop -c on an mmap/munmap loop)\n\n| threads | buffer | calls | calls/s (median) | delivered | reported lost | delivered + lost - calls | memtrace CPU per record | records/s one core of memtrace delivers |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    // The default buffer at 1, 2 and 4 threads; then one far too small for
    // the stream, to show that every record lost is reported.
    for (threads, extra) in [(1usize, None), (2, None), (4, None), (1, Some("8K"))] {
        let args: Vec<&str> = extra.map(|b| vec!["--buffer-size", b]).unwrap_or_default();
        // What the command does besides the loop (loader, thread stacks), measured.
        let (_, base, base_lost, _) = stream_once(threads, 0, &[])?;
        let n = 200_000 / threads;
        let mut rates = Vec::new();
        let mut per_rec = Vec::new();
        let mut last = (0, 0);
        for _ in 0..runs.min(3) {
            eprintln!("bench: streaming {threads} threads");
            let (rate, ev, lost, cpu) = stream_once(threads, n, &args)?;
            rates.push(rate);
            per_rec.push(cpu / ev.max(1) as f64);
            last = (ev, lost);
        }
        let calls = (2 * threads * n) as u64;
        let diff = (last.0 + last.1) as i64 - (calls + base + base_lost) as i64;
        let per = median(per_rec);
        out.push_str(&format!(
            "| {threads} | {} | {calls} | {:.0} | {} | {} | {diff:+} | {:.2} us | {:.0} |\n",
            extra.unwrap_or("default"),
            median(rates),
            last.0,
            last.1,
            per * 1e6,
            1.0 / per
        ));
    }
    out.push_str("\n(The last column but two subtracts the calls the command makes outside the loop, measured with an empty loop at the same thread count: 0 means every call was either delivered or reported lost. CPU per record is memtrace's user and system time over the records it delivered; its inverse is the rate one core of memtrace sustains, which this 2-core machine cannot produce while also running the workload.)\n");
    Ok(())
}

/// Per-event cost: each config runs the workload `runs` times, alternating.
fn per_event(
    title: &str,
    work: &[&str],
    events: u64,
    configs: &[Config],
    runs: usize,
    out: &mut String,
) -> Result<()> {
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut errors: Vec<Option<String>> = vec![None; configs.len()];
    for _ in 0..runs {
        for (i, c) in configs.iter().enumerate() {
            if errors[i].is_some() {
                continue;
            }
            let tracer = match &c.argv {
                Some(a) => match start(a, c.ready) {
                    Ok(t) => Some(t),
                    Err(e) => {
                        errors[i] = Some(e.to_string());
                        continue;
                    }
                },
                None => None,
            };
            eprintln!("bench: {title}: {}", c.name);
            let ns = run_workload(work)?;
            if let Some(t) = tracer {
                t.stop();
            }
            times[i].push(ns as f64 / events as f64);
        }
    }
    let base = median(times[0].clone());
    out.push_str(&format!("\n### {title}\n\n| tracer | ns per event (median) | added ns | runs |\n|---|---:|---:|---:|\n"));
    for (i, c) in configs.iter().enumerate() {
        if let Some(e) = &errors[i] {
            out.push_str(&format!("| {} | failed: {e} | | |\n", c.name));
            continue;
        }
        let m = median(times[i].clone());
        out.push_str(&format!(
            "| {} | {m:.0} | {:+.0} | {} |\n",
            c.name,
            m - base,
            times[i].len()
        ));
    }
    Ok(())
}

/// Start-up (launch to attached), and peak RSS over 10 seconds with load.
fn startup_rss(configs: &[Config], runs: usize, out: &mut String) -> Result<()> {
    out.push_str("\n### Start-up and peak RSS (10 s with faults, mmap and brk calls going)\n\n| tracer | start-up ms (median) | peak RSS MiB (median of 3) |\n|---|---:|---:|\n");
    for c in configs {
        let Some(argv) = c.argv.clone() else {
            out.push_str(&format!("| {} | not installed | |\n", c.name));
            continue;
        };
        let mut st = Vec::new();
        let mut rss = Vec::new();
        let mut err = None;
        for _ in 0..runs {
            match start(&argv, c.ready) {
                Ok(t) => {
                    st.push(t.startup.as_secs_f64() * 1000.0);
                    // Peak RSS over 10 s of faults, mmap calls and brk calls
                    // (three runs of each tracer; the others time start-up only).
                    if rss.len() < 3 {
                        let until = std::time::Instant::now() + Duration::from_secs(10);
                        while std::time::Instant::now() < until {
                            let _ = run_workload(&["touch-timed", "50000"]);
                            let _ = run_workload(&["mmap-loop", "1", "20000"]);
                            let _ = run_workload(&["rawbrk-timed", "20000"]);
                        }
                    } else {
                        std::thread::sleep(Duration::from_millis(300));
                    }
                    let pid = t.child.id();
                    // /usr/bin/time's child: the tracer.
                    let kids = Command::new("pgrep")
                        .args(["-P", &pid.to_string()])
                        .output()?;
                    let kid = String::from_utf8_lossy(&kids.stdout).trim().to_string();
                    let status =
                        std::fs::read_to_string(format!("/proc/{kid}/status")).unwrap_or_default();
                    let kb = status.lines().find_map(|l| l.strip_prefix("VmHWM:"));
                    if let Some(kb) = kb.filter(|_| rss.len() < 3) {
                        let kb: f64 = kb
                            .trim()
                            .trim_end_matches("kB")
                            .trim()
                            .parse()
                            .unwrap_or(0.0);
                        rss.push(kb / 1024.0);
                    }
                    t.stop();
                }
                Err(e) => {
                    err = Some(e.to_string());
                    break;
                }
            }
        }
        match err {
            Some(e) => out.push_str(&format!("| {} | failed: {e} | |\n", c.name)),
            None => out.push_str(&format!(
                "| {} | {:.1} | {:.1} |\n",
                c.name,
                median(st),
                median(rss)
            )),
        }
    }
    Ok(())
}

pub fn run(runs: usize) -> Result<()> {
    // A warm-up run: the first runs after a build page in binaries.
    let _ = run_workload(&["zero-faults", "10000", "2"]);
    ensure_peers();
    let m = memtrace();
    let bpftrace = have("bpftrace");
    let bt = |prog: &str| bpftrace.then(|| s(&["bpftrace", "-e", prog]));
    // A peer that is not installed is listed as such.
    let tool = |name: &str| -> Option<Vec<String>> {
        // Line-buffered, or a C tool's banner stays in its stdio buffer.
        have(name).then(|| s(&["stdbuf", "-oL", "-eL", name]))
    };
    let mut out = String::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name\t: ").map(str::to_string))
        .unwrap_or_default();
    let date = Command::new("date").arg("-u").arg("+%Y-%m-%d").output()?;
    out.push_str(&format!(
        "# memtrace benchmarks\n\n{} UTC, kernel {}, {} ({} CPUs), {runs} runs each, alternating; medians.\n",
        String::from_utf8_lossy(&date.stdout).trim(),
        kernel.trim(),
        cpu,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    ));
    let zero_n = (PAGES / 10).to_string();
    let none = |name| Config {
        name,
        argv: None,
        ready: "",
    };
    let bt_missing = "bpftrace not installed";
    let cfg = |name, argv: Option<Vec<String>>, ready| Config { name, argv, ready };
    per_event(
        &format!("Page faults, count by process ({PAGES} zero-page read faults)"),
        &["zero-faults", &zero_n, "10"],
        PAGES,
        &[
            none("untraced"),
            cfg(
                "empty raw_tp program (floor)",
                Some(s(&[&m, "faults", "--floor"])),
                "Tracing",
            ),
            cfg("memtrace faults", Some(s(&[&m, "faults"])), "Tracing"),
            cfg(
                "bpftrace @[pid] = count()",
                bt("tracepoint:exceptions:page_fault_user { @[pid] = count(); }"),
                "Attaching",
            ),
        ],
        runs,
        &mut out,
    )?;
    per_event(
        &format!("Page faults, count by user stack ({PAGES} zero-page read faults)"),
        &["zero-faults", &zero_n, "10"],
        PAGES,
        &[
            none("untraced"),
            cfg("memtrace faults --stacks", Some(s(&[&m, "faults", "--stacks"])), "Tracing"),
            cfg(
                "memtrace faults --stacks --stack-mode dwarf --sample 10",
                Some(s(&[&m, "faults", "--stacks", "--stack-mode", "dwarf", "--sample", "10"])),
                "Tracing",
            ),
            cfg(
                "bpftrace @[ustack] = count()",
                // The predicate keeps bpftrace from symbolizing every stack on the host at exit.
                bt("tracepoint:exceptions:page_fault_user /comm == \"memtrace-worklo\"/ { @[ustack] = count(); }"),
                "Attaching",
            ),
        ],
        runs,
        &mut out,
    )?;
    let brks = BRKS.to_string();
    per_event(
        &format!("brk calls by user stack ({BRKS} calls)"),
        &["rawbrk-timed", &brks],
        BRKS,
        &[
            none("untraced"),
            cfg(
                "empty tracepoint program (floor)",
                Some(s(&[&m, "brkstack", "--floor"])),
                "Tracing",
            ),
            cfg(
                "memtrace brkstack --stack-mode fp",
                Some(s(&[&m, "brkstack", "--stack-mode", "fp"])),
                "Tracing",
            ),
            // The default: every call's stack copied (16 KiB) and unwound here.
            cfg(
                "memtrace brkstack (dwarf)",
                Some(s(&[&m, "brkstack"])),
                "Tracing",
            ),
            cfg(
                "bpftrace brkstack.bt",
                bt("tracepoint:syscalls:sys_enter_brk { @[ustack, comm] = count(); }"),
                "Attaching",
            ),
        ],
        runs,
        &mut out,
    )?;
    per_event(
        &format!("mmap + munmap streamed one record per call ({MMAPS} pairs, one thread)"),
        &["mmap-loop", "1", &MMAPS.to_string()],
        2 * MMAPS,
        &[
            none("untraced"),
            cfg(
                "empty tracepoint programs (floor)",
                Some(s(&[&m, "mmapsnoop", "--floor"])),
                "Tracing",
            ),
            cfg("memtrace mmapsnoop", Some(s(&[&m, "mmapsnoop"])), "Tracing"),
            cfg(
                "bpftrace printf",
                bt("tracepoint:syscalls:sys_exit_mmap,tracepoint:syscalls:sys_exit_munmap { printf(\"%d %s %d\\n\", pid, comm, args->ret); }"),
                "Attaching",
            ),
        ],
        runs,
        &mut out,
    )?;
    streaming(runs, &mut out)?;
    startup_rss(
        &[
            cfg("memtrace oomkill", Some(s(&[&m, "oomkill"])), "Tracing"),
            cfg("memtrace faults", Some(s(&[&m, "faults"])), "Tracing"),
            cfg("memtrace brkstack", Some(s(&[&m, "brkstack"])), "Tracing"),
            cfg("memtrace drsnoop", Some(s(&[&m, "drsnoop"])), "Tracing"),
            cfg("memtrace mmapsnoop", Some(s(&[&m, "mmapsnoop"])), "Tracing"),
            cfg("libbpf-tools oomkill", tool("oomkill"), "Tracing"),
            cfg("libbpf-tools drsnoop", tool("drsnoop"), "LAT(ms)"),
            cfg("BCC oomkill", tool("oomkill-bpfcc"), "Tracing"),
            cfg("BCC stackcount -U t:syscalls:sys_enter_brk", tool("stackcount-bpfcc").map(|mut v| { v.extend(s(&["-U", "t:syscalls:sys_enter_brk"])); v }), "Tracing"),
            cfg(
                "bpftrace brkstack.bt",
                bt("tracepoint:syscalls:sys_enter_brk /comm == \"memtrace-worklo\"/ { @[ustack, comm] = count(); }"),
                "Attaching",
            ),
            cfg(
                "bpftrace oom:mark_victim",
                bt("tracepoint:oom:mark_victim { printf(\"%d\\n\", args->pid); }"),
                "Attaching",
            ),
            cfg(
                "bpftrace faults by pid",
                bt("tracepoint:exceptions:page_fault_user { @[pid] = count(); }"),
                "Attaching",
            ),
        ],
        runs,
        &mut out,
    )?;
    if !bpftrace {
        out.push_str(&format!("\nbpftrace: {bt_missing}\n"));
    }
    print!("{out}");
    let dir = root().join("bench");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("RESULTS.md"), &out)?;
    eprintln!("bench: wrote bench/RESULTS.md");
    Ok(())
}
