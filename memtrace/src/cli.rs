//! Command line: shared arguments are flattened into every tool.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::attach::Method;

#[derive(Debug, Parser)]
#[command(
    name = "memtrace",
    version,
    about = "Who is eating memory, from which code path, and who got OOM-killed",
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// OOM kills: trigger, victim, RSS, memcg, pages considered.
    Oomkill(crate::tools::oomkill::Args),
    /// Page faults counted in the kernel, by process, stack or mapping.
    Faults(crate::tools::faults::Args),
    /// File-backed page faults by file.
    Ffaults(crate::tools::ffaults::Args),
    /// Heap growth (brk) counted by user stack.
    Brkstack(crate::tools::brkstack::Args),
    /// Reclaim dashboard: slab, direct and memcg reclaim time per interval.
    Vmscan(crate::tools::vmscan::Args),
    /// One line per direct or memcg reclaim stall.
    Drsnoop(crate::tools::drsnoop::Args),
    /// Swap-ins by process (needs kprobe or fentry).
    Swapin(crate::tools::swapin::Args),
    /// RSS of a process from the kernel's counter changes, with a threshold guard.
    Rss(crate::tools::rss::Args),
    /// One line per mmap, munmap, mremap and brk call, with its result.
    Mmapsnoop(crate::tools::mmapsnoop::Args),
    /// One line per SysV shm call (shmget, shmat, shmdt, shmctl).
    Shmsnoop(crate::tools::shmsnoop::Args),
    /// What this kernel supports and how each tool would attach here.
    Doctor,
}

#[derive(Debug, Clone, Args)]
pub struct Common {
    /// Trace only this process (all its threads).
    #[arg(short = 'p', long = "pid", value_parser = parse_pid)]
    pub pid: Option<u32>,
    /// Also trace processes forked by the traced one after the trace starts.
    #[arg(long)]
    pub children: bool,
    /// Run this command (and its children), traced from its first instruction; end when it exits.
    #[arg(short = 'c', long = "command", conflicts_with = "pid")]
    pub command: Option<String>,
    /// Stop after this long (e.g. 10, 10s, 500ms, 2m).
    #[arg(short = 'd', long = "duration", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Prefix lines with the time.
    #[arg(short = 'T', long = "timestamp")]
    pub timestamps: bool,
    /// JSON Lines output: one object per event, then a summary object.
    #[arg(long)]
    pub json: bool,
    /// Say how each probe was attached, and show kernel-side diagnostics.
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Use only this attach method (to exercise a fallback).
    #[arg(long, value_enum, env = "MEMTRACE_ATTACH")]
    pub attach: Option<Method>,
}

pub fn parse_pid(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(0) => Err("pid must be greater than 0".into()),
        Ok(p) => Ok(p),
        Err(_) => Err(format!("'{s}' is not a process id")),
    }
}

/// Seconds by default; `ms`, `s`, `m`, `h` suffixes.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult_ms) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3_600_000.0)
    } else {
        (s, 1000.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => {
            Ok(Duration::from_micros((v * mult_ms * 1000.0) as u64))
        }
        _ => Err(format!("'{s}' is not a duration (try 10, 10s, 500ms, 2m)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("-1").is_err());
    }

    #[test]
    fn pids() {
        assert!(parse_pid("0").is_err());
        assert!(parse_pid("abc").is_err());
        assert_eq!(parse_pid("42").unwrap(), 42);
    }
}
