//! memleak's cost per malloc/free pair, against the classic memleak.bt
//! (size at entry, address and user stack at return, delete at free),
//! each running the same timed loop as its `-c` command.

use std::process::{Command, Stdio};

use anyhow::Result;

use super::tracer::{have, median, memtrace, workload};

const PAIRS: u64 = 200_000;

/// The libc this machine's programs map.
fn libc_path() -> Option<String> {
    std::fs::read_to_string("/proc/self/maps")
        .ok()?
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so"))
        .map(str::to_string)
}

/// The loop's own time in ns, run under `argv` (`-c` appended; untraced
/// when empty), or None.
fn once(argv: &[String]) -> Option<f64> {
    let cmd = format!("{} malloc-loop {PAIRS}", workload());
    let mut c = match argv.split_first() {
        Some((prog, rest)) => {
            let mut c = Command::new(prog);
            c.args(rest).args(["-c", &cmd]);
            c
        }
        None => {
            let mut c = Command::new(workload());
            c.args(["malloc-loop", &PAIRS.to_string()]);
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

pub(super) fn memleak_cost(runs: usize, out: &mut String) -> Result<()> {
    let m = memtrace();
    let libc = libc_path().unwrap_or_else(|| "libc".into());
    let bt = format!(
        "uprobe:{libc}:malloc /pid == cpid/ {{ @size[tid] = arg0; }} \
         uretprobe:{libc}:malloc /@size[tid]/ {{ @mem[retval] = @size[tid]; @stack[retval] = ustack; delete(@size[tid]); }} \
         uprobe:{libc}:free /@mem[arg0]/ {{ delete(@mem[arg0]); delete(@stack[arg0]); }}"
    );
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let configs: Vec<(&str, Option<Vec<String>>)> = vec![
        ("untraced", Some(Vec::new())),
        (
            "memtrace memleak (uprobe session)",
            Some(owned(&[&m, "memleak"])),
        ),
        (
            "memtrace memleak, uprobe + uretprobe",
            Some(owned(&[&m, "memleak", "--no-uprobe-session"])),
        ),
        (
            "memtrace memleak, every probe at the function's entry",
            Some(owned(&[&m, "memleak", "--probe-at-entry"])),
        ),
        (
            "memtrace memleak --sample-bytes 512K (uprobe session)",
            Some(owned(&[&m, "memleak", "--sample-bytes", "512K"])),
        ),
        (
            "memtrace memleak --sample-bytes 512K, uprobe + uretprobe",
            Some(owned(&[
                &m,
                "memleak",
                "--sample-bytes",
                "512K",
                "--no-uprobe-session",
            ])),
        ),
        (
            "bpftrace memleak.bt",
            have("bpftrace").then(|| owned(&["bpftrace", "-e", &bt])),
        ),
    ];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for _ in 0..runs {
        for (i, (_, argv)) in configs.iter().enumerate() {
            if let Some(t) = argv.as_deref().and_then(once) {
                times[i].push(t);
            }
        }
    }
    let per = |i: usize| (!times[i].is_empty()).then(|| median(times[i].clone()) / PAIRS as f64);
    let base = per(0).unwrap_or(0.0);
    let bt_added = per(configs.len() - 1).map(|t| t - base);
    out.push_str(&format!(
        "\n### memleak: cost per malloc(16)/free pair ({PAIRS} pairs, traced with -c)\n\n\
         | tracer | ns per pair | added ns per pair | added vs memleak.bt |\n|---|---:|---:|---:|\n"
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
    if let Some(t) = configs
        .iter()
        .position(|(n, _)| n.starts_with("memtrace memleak --sample-bytes"))
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
