//! memleak's cost per malloc/free pair, per calloc/free pair and per
//! realloc call, against the classic memleak.bt (size at entry, address and
//! user stack at return, delete at free) extended to the same function,
//! each running the same timed loop as its `-c` command.

use std::process::{Command, Stdio};

use anyhow::Result;

use super::tracer::{go_and_time, have, median, memtrace, workload};

const PAIRS: u64 = 200_000;
/// The configuration that runs `memcg --heap` beside the loop.
const MEMCG_HEAP: &str = "@memcg-heap";
/// The configuration that starts the loop, attaches with `-p`, then runs it.
const BY_PID: &str = "@pid";
/// Where heaptrack writes its data (it adds .zst or .gz).
const HEAPTRACK_OUT: &str = "/tmp/memtrace-bench-heaptrack";

/// The libc this machine's programs map.
fn libc_path() -> Option<String> {
    std::fs::read_to_string("/proc/self/maps")
        .ok()?
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so"))
        .map(str::to_string)
}

/// The loop's own time in ns for `pairs`, run under `argv` (`-c`
/// appended; untraced when empty), or None.
fn once(lp: &str, argv: &[String], pairs: u64) -> Option<f64> {
    let cmd = format!("{} {lp} {pairs}", workload());
    let mut c = match argv.split_first() {
        // memcg --heap watches the group the loop runs in.
        Some((prog, rest)) if prog == MEMCG_HEAP => return super::heap::once(lp, pairs, rest),
        Some((prog, rest)) if prog == BY_PID => return by_pid(lp, rest),
        // heaptrack runs its program as its arguments, no -c.
        Some((prog, rest)) if prog == "heaptrack" => {
            let mut c = Command::new(prog);
            c.args(rest).arg(workload()).args([lp, &pairs.to_string()]);
            c
        }
        Some((prog, rest)) => {
            let mut c = Command::new(prog);
            c.args(rest).args(["-c", &cmd]);
            c
        }
        None => {
            let mut c = Command::new(workload());
            c.args([lp, &pairs.to_string()]);
            c
        }
    };
    let out = c
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("elapsed_ns ")?.trim().parse().ok())
}

/// The loop's time under `argv -p PID`: the loop waits for memtrace's
/// start line before it runs.
fn by_pid(lp: &str, argv: &[String]) -> Option<f64> {
    use std::io::{BufRead, BufReader};
    let mut w = Command::new(workload())
        .args(["--wait", lp, &PAIRS.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .ok()?;
    let mut lines = BufReader::new(w.stdout.take()?).lines();
    let pid = lines.next()?.ok()?;
    let (prog, rest) = argv.split_first()?;
    let mut t = Command::new(prog)
        .args(rest)
        .args(["-p", pid.trim()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let started = BufReader::new(t.stderr.take()?)
        .lines()
        .map_while(|l| l.ok())
        .any(|l| l.starts_with("Tracing"));
    let ns = go_and_time(&mut w, lines);
    let _ = Command::new("kill")
        .args(["-INT", &t.id().to_string()])
        .status();
    let _ = t.wait();
    ns.filter(|_| started)
}

/// memleak.bt's classic program, with its entry and return probes on `f`
/// (realloc also drops the old block, as memleak.bt's free does).
fn memleak_bt(libc: &str, f: &str) -> String {
    let (size, old) = match f {
        "calloc" => ("arg0 * arg1", ""),
        "realloc" => ("arg1", "delete(@mem[arg0]); delete(@stack[arg0]); "),
        _ => ("arg0", ""),
    };
    format!(
        "uprobe:{libc}:{f} /pid == cpid/ {{ {old}@size[tid] = {size}; }} \
         uretprobe:{libc}:{f} /@size[tid]/ {{ @mem[retval] = @size[tid]; @stack[retval] = ustack; delete(@size[tid]); }} \
         uprobe:{libc}:free /@mem[arg0]/ {{ delete(@mem[arg0]); delete(@stack[arg0]); }}"
    )
}

pub(super) fn memleak_cost(runs: usize, out: &mut String) -> Result<()> {
    for (lp, f, what, unit) in [
        ("malloc-loop", "malloc", "malloc(16)/free pair", "pair"),
        ("calloc-loop", "calloc", "calloc(1, 16)/free pair", "pair"),
        (
            "realloc-loop",
            "realloc",
            "realloc call, 16 to 48 bytes and back",
            "call",
        ),
    ] {
        loop_cost(runs, [lp, f, what, unit], out)?;
    }
    steady(runs, out);
    Ok(())
}

/// heaptrack's data from the runs (it adds .zst or .gz to the name).
fn remove_heaptrack_out() {
    for ext in ["zst", "gz"] {
        let _ = std::fs::remove_file(format!("{HEAPTRACK_OUT}.{ext}"));
    }
}

/// Pairs of the long run that `steady` sets beside the bench's `PAIRS`.
const LONG: u64 = 2_000_000;

/// Cost per pair apart from a tracer's start-up: the loop timed at `PAIRS`
/// and at `LONG` pairs; the slope is what each more pair adds, the rest a
/// fixed cost paid inside the loop (heaptrack sets itself up at the
/// program's first allocation, which the 200,000-pair figure carries).
fn steady(runs: usize, out: &mut String) {
    let m = memtrace();
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let configs = [
        ("untraced", Some(Vec::new())),
        (
            "memtrace memleak (preloaded shim, exact)",
            Some(owned(&[&m, "memleak"])),
        ),
        (
            "heaptrack",
            have("heaptrack").then(|| owned(&["heaptrack", "-o", HEAPTRACK_OUT])),
        ),
    ];
    out.push_str(&format!(
        "\n### memleak: malloc(16)/free pairs, per pair and fixed ({PAIRS} and {LONG} pairs)\n\n\
         | tracer | added ns per pair (slope) | fixed ms in the loop | added ns per pair at {PAIRS} |\n\
         |---|---:|---:|---:|\n"
    ));
    let time = |argv: &[String], n: u64| {
        let t: Vec<f64> = (0..runs)
            .filter_map(|_| once("malloc-loop", argv, n))
            .collect();
        (!t.is_empty()).then(|| median(t))
    };
    // The untraced loop's (slope, fixed, time at PAIRS), from the first row.
    let mut base = None;
    for (name, argv) in &configs {
        let Some(argv) = argv else {
            out.push_str(&format!("| {name} | not installed | | |\n"));
            continue;
        };
        let (Some(short), Some(long)) = (time(argv, PAIRS), time(argv, LONG)) else {
            out.push_str(&format!("| {name} | failed to run | | |\n"));
            continue;
        };
        let slope = (long - short) / (LONG - PAIRS) as f64;
        let fixed = short - slope * PAIRS as f64;
        let (b_slope, b_fixed, b_short) = *base.get_or_insert((slope, fixed, short));
        let added_short = (short - b_short) / PAIRS as f64;
        out.push_str(&format!(
            "| {name} | {:+.0} | {:.1} | {added_short:+.0} |\n",
            slope - b_slope,
            (fixed - b_fixed) / 1e6
        ));
    }
    remove_heaptrack_out();
}

fn loop_cost(runs: usize, [lp, f, what, unit]: [&str; 4], out: &mut String) -> Result<()> {
    let m = memtrace();
    let libc = libc_path().unwrap_or_else(|| "libc".into());
    let bt = memleak_bt(&libc, f);
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // The variants that only differ in where probes land are measured on
    // the malloc loop alone.
    let all = f == "malloc";
    let mut configs: Vec<(&str, Option<Vec<String>>)> = vec![
        ("untraced", Some(Vec::new())),
        (
            "memtrace memleak (preloaded shim)",
            Some(owned(&[&m, "memleak"])),
        ),
        (
            "memtrace memleak --sample-bytes 512K (preloaded shim)",
            Some(owned(&[&m, "memleak", "--sample-bytes", "512K"])),
        ),
        (
            "memtrace memleak --no-preload (uprobe session)",
            Some(owned(&[&m, "memleak", "--no-preload"])),
        ),
        (
            "memtrace memleak --no-preload, uprobe + uretprobe",
            Some(owned(&[
                &m,
                "memleak",
                "--no-preload",
                "--no-uprobe-session",
            ])),
        ),
        (
            "memtrace memleak --no-preload, every probe at the function's entry",
            Some(owned(&[&m, "memleak", "--no-preload", "--probe-at-entry"])),
        ),
        (
            "memtrace memleak --no-preload --sample-bytes 512K (uprobe session)",
            Some(owned(&[
                &m,
                "memleak",
                "--no-preload",
                "--sample-bytes",
                "512K",
            ])),
        ),
        (
            "memtrace memleak --no-preload --sample-bytes 512K, uprobe + uretprobe",
            Some(owned(&[
                &m,
                "memleak",
                "--no-preload",
                "--sample-bytes",
                "512K",
                "--no-uprobe-session",
            ])),
        ),
        // A running process (-p): the shim loaded into it, or uprobes.
        (
            "memtrace memleak -p (shim injected)",
            Some(owned(&[BY_PID, &m, "memleak"])),
        ),
        (
            "memtrace memleak -p --sample-bytes 512K (shim injected)",
            Some(owned(&[BY_PID, &m, "memleak", "--sample-bytes", "512K"])),
        ),
        (
            "memtrace memleak -p --sample-bytes 512K --no-inject (uprobe session)",
            Some(owned(&[
                BY_PID,
                &m,
                "memleak",
                "--sample-bytes",
                "512K",
                "--no-inject",
            ])),
        ),
        // The OOM heap (issue 36): its default, the shim loaded into a
        // process of a watched group as it is found, and by uprobes.
        (
            "memtrace memcg --heap (sampled 512K, shim injected; the loop in the watched group)",
            Some(owned(&[MEMCG_HEAP])),
        ),
        (
            "memtrace memcg --heap --no-inject (sampled 512K, uprobes; the loop in the watched group)",
            Some(owned(&[MEMCG_HEAP, "--no-inject"])),
        ),
        // The user-space anchor: an LD_PRELOAD profiler that unwinds every
        // call in the process (its data to a file, removed below).
        (
            "heaptrack",
            have("heaptrack").then(|| owned(&["heaptrack", "-o", HEAPTRACK_OUT])),
        ),
        (
            "bpftrace memleak.bt",
            have("bpftrace").then(|| owned(&["bpftrace", "-e", &bt])),
        ),
    ];
    if !all {
        configs.retain(|(n, _)| !n.contains("every probe") && !n.ends_with("uprobe + uretprobe"));
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for _ in 0..runs {
        for (i, (_, argv)) in configs.iter().enumerate() {
            if let Some(t) = argv.as_deref().and_then(|a| once(lp, a, PAIRS)) {
                times[i].push(t);
            }
        }
    }
    remove_heaptrack_out();
    let per = |i: usize| (!times[i].is_empty()).then(|| median(times[i].clone()) / PAIRS as f64);
    let base = per(0).unwrap_or(0.0);
    let bt_added = per(configs.len() - 1).map(|t| t - base);
    out.push_str(&format!(
        "\n### memleak: cost per {what} ({PAIRS} {unit}s, traced with -c)\n\n\
         | tracer | ns per {unit} | added ns per {unit} | added vs memleak.bt |\n|---|---:|---:|---:|\n"
    ));
    for (i, (name, argv)) in configs.iter().enumerate() {
        match (argv, per(i)) {
            (Some(_), Some(t)) => {
                let added = t - base;
                let ratio = match bt_added {
                    Some(b) if i > 0 && b > 0.0 => format!("{:.2}", added / b),
                    _ => "-".into(),
                };
                out.push_str(&format!("| {name} | {t:.0} | {added:+.0} | {ratio} |\n"));
            }
            (None, _) => out.push_str(&format!("| {name} | not installed | | |\n")),
            (Some(_), None) => out.push_str(&format!("| {name} | failed to run | | |\n")),
        }
    }
    // The yardstick for sampling: a program making 1M allocations a
    // second spends 1000 ns per pair; what sampling adds, relative to that.
    if let Some(t) = all
        .then_some(())
        .and(
            configs
                .iter()
                .position(|(n, _)| n.starts_with("memtrace memleak --sample-bytes")),
        )
        .and_then(per)
    {
        let added = t - base;
        out.push_str(&format!(
            "\n(A program making 1M malloc/free pairs a second, 1000 ns each, would run \
             {:.0}% slower under the first sampled line: {added:+.0} ns a pair.)\n",
            added / 10.0
        ));
    }
    Ok(())
}
