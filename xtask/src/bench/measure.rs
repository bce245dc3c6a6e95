//! The measurements: per event, streamed records, start-up and memory.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Result;

use super::tracer::{median, memtrace, run_workload, start, workload, Config};

/// One `memtrace mmapsnoop -c` run on an mmap/munmap loop of `threads`
/// threads: (calls/s, delivered, reported lost, memtrace's CPU seconds).
pub(super) fn stream_once(
    threads: usize,
    n: usize,
    extra: &[&str],
) -> Result<(f64, u64, u64, f64)> {
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
pub(super) fn streaming(runs: usize, out: &mut String) -> Result<()> {
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
pub(super) fn per_event(
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
pub(super) fn startup_rss(configs: &[Config], runs: usize, out: &mut String) -> Result<()> {
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
