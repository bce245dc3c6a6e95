//! `cargo xtask bench`: memtrace against the peer tools on the same
//! workloads, alternating tools, medians of several runs. Writes
//! bench/RESULTS.md.

use std::process::Command;

use anyhow::Result;

use crate::root;

mod compare;
mod golang;
mod heap;
mod measure;
mod memleak;
mod redis;
mod tables;
mod tracer;

use measure::{per_event, startup_rss, streaming};
use tracer::{ensure_peers, have, memtrace, run_workload, s, Config};

// Runs of a second or more: at 0.1 s, this VM's jitter moved medians by
// 50-100 ns per event from one bench run to the next.
const PAGES: u64 = 1_000_000;
const BRKS: u64 = 1_000_000;
const MMAPS: u64 = 300_000;
/// One section, replacing its earlier figures in bench/RESULTS.md.
/// `check`: an error when a figure got more than a fifth worse.
pub fn run_only(section: &str, runs: usize, check: bool) -> Result<()> {
    let mut out = String::new();
    match section {
        "startup" => {
            ensure_peers();
            startup_rss(&startup_configs(), runs, &mut out)?
        }
        "memleak" => memleak::memleak_cost(runs, &mut out)?,
        "stacks" => {
            ensure_peers();
            let bpftrace = have("bpftrace");
            let bt = |prog: &str| bpftrace.then(|| s(&["bpftrace", "-e", prog]));
            stack_costs(&memtrace(), &bt, runs, &mut out)?
        }
        "tables" => tables::startup_tables(&memtrace(), runs, &mut out)?,
        "redis" => redis::redis_cost(runs, &mut out)?,
        "go" => golang::go_cost(runs, &mut out)?,
        _ => {
            anyhow::bail!(
                "no bench section {section} (sections: memleak, stacks, tables, startup, redis, \
                 go)"
            )
        }
    }
    print!("{out}");
    let path = root().join("bench").join("RESULTS.md");
    let kept = std::fs::read_to_string(&path).unwrap_or_default();
    let slipped = compare::report(&kept, &out, check);
    std::fs::write(&path, replace_section(&kept, &out))?;
    eprintln!("bench: updated the {section} section of bench/RESULTS.md");
    slipped
}

/// `results` with the tables of `section` in place of their earlier ones,
/// where the first of them was; a new section goes before the tables kept
/// by hand (which a bench run never writes).
fn replace_section(results: &str, section: &str) -> String {
    let mut kept = results.to_string();
    let mut first: Option<usize> = None;
    for head in section.lines().filter(|l| l.starts_with("### ")) {
        if let Some(at) = kept.find(head) {
            let rest = &kept[at + head.len()..];
            let end = rest
                .find("\n### ")
                .map_or(kept.len(), |e| at + head.len() + e + 1);
            kept = format!("{}{}", &kept[..at], &kept[end..]);
            first = Some(first.map_or(at, |f| f.min(at)));
        }
    }
    let at = first
        .or_else(|| kept.find("### Kept by hand"))
        .unwrap_or(kept.len());
    let (before, after) = kept.split_at(at);
    let before = before.trim_end();
    let sep = if before.is_empty() { "" } else { "\n\n" };
    match after.is_empty() {
        true => format!("{before}{sep}{}\n", section.trim_end()),
        false => format!("{before}{sep}{}\n\n{after}", section.trim_end()),
    }
}

/// Start-up and peak RSS: the tools that run system-wide, beside the peers.
fn startup_configs() -> Vec<Config> {
    let m = memtrace();
    let bpftrace = have("bpftrace");
    let bt = |prog: &str| bpftrace.then(|| s(&["bpftrace", "-e", prog]));
    // Line-buffered, or a C tool's banner stays in its stdio buffer.
    let tool = |name: &str| -> Option<Vec<String>> {
        have(name).then(|| s(&["stdbuf", "-oL", "-eL", name]))
    };
    let cfg = |name, argv: Option<Vec<String>>, ready| Config { name, argv, ready };
    let ours = |name: &'static str, tool: &str| cfg(name, Some(s(&[&m, tool])), "Tracing");
    vec![
        ours("memtrace oomkill", "oomkill"),
        ours("memtrace faults", "faults"),
        ours("memtrace brkstack", "brkstack"),
        ours("memtrace drsnoop", "drsnoop"),
        ours("memtrace mmapsnoop", "mmapsnoop"),
        ours("memtrace shmsnoop", "shmsnoop"),
        ours("memtrace vmscan", "vmscan"),
        ours("memtrace memleak", "memleak"),
        cfg("libbpf-tools oomkill", tool("oomkill"), "Tracing"),
        cfg("libbpf-tools drsnoop", tool("drsnoop"), "LAT(ms)"),
        cfg("BCC oomkill", tool("oomkill-bpfcc"), "Tracing"),
        cfg(
            "BCC stackcount -U t:syscalls:sys_enter_brk",
            tool("stackcount-bpfcc").map(|mut v| {
                v.extend(s(&["-U", "t:syscalls:sys_enter_brk"]));
                v
            }),
            "Tracing",
        ),
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
    ]
}

/// User stacks: page faults and brk calls by stack, each way of taking them.
fn stack_costs(
    m: &str,
    bt: &dyn Fn(&str) -> Option<Vec<String>>,
    runs: usize,
    out: &mut String,
) -> Result<()> {
    let cfg = |name, argv: Option<Vec<String>>, ready| Config { name, argv, ready };
    let none = |name| Config {
        name,
        argv: None,
        ready: "",
    };
    let zero_n = (PAGES / 10).to_string();
    per_event(
        &format!("Page faults, count by user stack ({PAGES} zero-page read faults)"),
        &["zero-faults", &zero_n, "10"],
        PAGES,
        &[
            none("untraced"),
            // System-wide, as a user runs it: the default is DWARF
            // unwound in the kernel.
            cfg(
                "memtrace faults --stacks (default: dwarf in the kernel)",
                Some(s(&[m, "faults", "--stacks"])),
                "Tracing",
            ),
            // Keyed by process: what finding each process's image costs.
            cfg(
                "memtrace faults --stacks --per-pid (keyed by process)",
                Some(s(&[m, "faults", "--stacks", "--per-pid"])),
                "Tracing",
            ),
            cfg(
                "memtrace faults --stacks --stack-mode fp",
                Some(s(&[m, "faults", "--stacks", "--stack-mode", "fp"])),
                "Tracing",
            ),
            cfg(
                "memtrace faults --stacks --stack-mode dwarf --sample 10 (copied)",
                Some(s(&[m, "faults", "--stacks", "--stack-mode", "dwarf", "--sample", "10"])),
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
        out,
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
                Some(s(&[m, "brkstack", "--floor"])),
                "Tracing",
            ),
            cfg(
                "memtrace brkstack --stack-mode fp",
                Some(s(&[m, "brkstack", "--stack-mode", "fp"])),
                "Tracing",
            ),
            // Every call's stack unwound in the kernel (the default with -p
            // or -c; system-wide, brk calls are copied).
            cfg(
                "memtrace brkstack --unwinder kernel (dwarf)",
                Some(s(&[m, "brkstack", "--unwinder", "kernel"])),
                "Tracing",
            ),
            // Every call's stack copied (16 KiB) and unwound here.
            cfg(
                "memtrace brkstack --unwinder copy (dwarf, copied)",
                Some(s(&[m, "brkstack", "--unwinder", "copy"])),
                "Tracing",
            ),
            cfg(
                "bpftrace brkstack.bt",
                bt("tracepoint:syscalls:sys_enter_brk { @[ustack, comm] = count(); }"),
                "Attaching",
            ),
        ],
        runs,
        out,
    )?;
    Ok(())
}

pub fn run(runs: usize, check: bool) -> Result<()> {
    // A warm-up run: the first runs after a build page in binaries.
    let _ = run_workload(&["zero-faults", "10000", "2"]);
    ensure_peers();
    let m = memtrace();
    let bpftrace = have("bpftrace");
    let bt = |prog: &str| bpftrace.then(|| s(&["bpftrace", "-e", prog]));
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
    stack_costs(&m, &bt, runs, &mut out)?;
    tables::startup_tables(&m, runs, &mut out)?;
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
    memleak::memleak_cost(runs, &mut out)?;
    redis::redis_cost(runs, &mut out)?;
    golang::go_cost(runs, &mut out)?;
    startup_rss(&startup_configs(), runs, &mut out)?;
    if !bpftrace {
        out.push_str(&format!("\nbpftrace: {bt_missing}\n"));
    }
    print!("{out}");
    let dir = root().join("bench");
    std::fs::create_dir_all(&dir)?;
    let old = std::fs::read_to_string(dir.join("RESULTS.md")).unwrap_or_default();
    let slipped = compare::report(&old, &out, check);
    std::fs::write(dir.join("RESULTS.md"), &out)?;
    eprintln!("bench: wrote bench/RESULTS.md");
    slipped
}

#[cfg(test)]
mod tests {
    use super::replace_section;

    #[test]
    fn a_section_is_replaced_where_it_was_and_a_new_one_goes_before_the_kept() {
        let old = "# R\n\n### A\n\n| a | 1 |\n\n### B\n\n| b | 2 |\n\n### Kept by hand: x\n\nk\n";
        assert_eq!(
            replace_section(old, "### A\n\n| a | 9 |\n"),
            "# R\n\n### A\n\n| a | 9 |\n\n### B\n\n| b | 2 |\n\n### Kept by hand: x\n\nk\n"
        );
        assert_eq!(
            replace_section(old, "### C\n\n| c | 3 |\n"),
            "# R\n\n### A\n\n| a | 1 |\n\n### B\n\n| b | 2 |\n\n### C\n\n| c | 3 |\n\n### Kept by hand: x\n\nk\n"
        );
    }
}
