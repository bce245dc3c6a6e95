//! Command line: shared arguments are flattened into every tool.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::session::attach::Method;

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
// Parsed once per run: the size of the largest tool's arguments does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    #[command(flatten)]
    Tool(crate::tools::ToolCommand),
    /// What this kernel supports and how each tool would attach here.
    Doctor,
    /// Reads a file written with --record: the live tool's views, summed or per interval, and flame graphs.
    Report(crate::record::args::ReportArgs),
    /// Compares two records: stacks that appeared, vanished, grew or shrank.
    Diff(crate::record::args::DiffArgs),
    /// Verdicts and notes on stacks, applied by report and diff.
    #[command(subcommand)]
    Annotate(crate::record::args::AnnotateCmd),
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
    /// When memtrace ends before its -c command (-d, Ctrl-C, COUNT), leave
    /// the command running, untraced, instead of ending it as timeout does
    /// (SIGTERM, then SIGKILL 5 s later).
    #[arg(long, requires = "command")]
    pub keep_command: bool,
    /// Prefix lines with the time.
    #[arg(short = 'T', long = "timestamp")]
    pub timestamps: bool,
    /// JSON Lines output: one object per event, then a summary object.
    #[arg(long)]
    pub json: bool,
    /// Write the report to FILE instead of stdout, as strace -o does: a
    /// command's own output then stays apart from it.
    #[arg(long, value_name = "FILE")]
    pub output: Option<std::path::PathBuf>,
    /// memtrace's own OOM score adjustment for the run: at -1000 the OOM
    /// killer it reports never picks it. A -c command keeps the score
    /// memtrace started with.
    #[arg(long, default_value_t = -1000, value_name = "N",
          value_parser = clap::value_parser!(i32).range(-1000..=1000),
          allow_negative_numbers = true)]
    pub oom_score_adj: i32,
    /// Say how each probe was attached, and show kernel-side diagnostics.
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Use only this attach method (to exercise a fallback).
    #[arg(long, value_enum, env = "MEMTRACE_ATTACH")]
    pub attach: Option<Method>,
    /// Size of the ring buffer that carries records to memtrace (e.g. 512K,
    /// 8M; rounded up to a power of two). Bigger loses fewer records in
    /// bursts, and is resident memory twice over (the kernel maps it twice).
    #[arg(long, value_parser = parse_buffer_size)]
    pub buffer_size: Option<u32>,
    /// Stack frames with their offsets (`memset+0xc0`), each call site apart.
    #[arg(long, conflicts_with = "lines")]
    pub addresses: bool,
    /// Stack frames with their source file and line.
    #[arg(long)]
    pub lines: bool,
    /// Keep identical stacks of different processes apart.
    #[arg(long)]
    pub per_pid: bool,
    /// Also write every stack report to FILE, for `memtrace report`, `diff` and `annotate`.
    #[arg(long, value_name = "FILE")]
    pub record: Option<std::path::PathBuf>,
    /// At the end, write the run's stacks, summed, to FILE as a gzip'd
    /// pprof profile (go tool pprof, Pyroscope, Parca, Grafana).
    #[arg(long, value_name = "FILE")]
    pub pprof: Option<std::path::PathBuf>,
    /// At the end, write the run's stacks, summed, to FILE as OpenTelemetry
    /// profiles (OTLP ProfilesData; gzip'd when FILE ends in .gz).
    #[arg(long, value_name = "FILE")]
    pub otlp: Option<std::path::PathBuf>,
    /// At the end, send them to an OTLP/HTTP receiver
    /// (http://HOST[:PORT][/PATH]; port 4318 and /v1development/profiles
    /// unless given).
    #[arg(long, value_name = "URL", value_parser = crate::record::push::parse_url)]
    pub otlp_push: Option<crate::record::push::Endpoint>,
    /// Every this long, a line on stderr with the events counted and lost
    /// so far (long runs; `cargo xtask soak` reads it).
    #[arg(long, value_name = "SECS", value_parser = parse_duration)]
    pub progress: Option<Duration>,
    /// Attach empty programs where the tool's would go (the benchmark floor).
    #[arg(long, hide = true)]
    pub floor: bool,
}

pub fn parse_pid(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(0) => Err("pid must be greater than 0".into()),
        Ok(p) => Ok(p),
        Err(_) => Err(format!("'{s}' is not a process id")),
    }
}

/// How user stacks are taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StackMode {
    /// Walk frame pointers in the kernel: cheap, but stops at code built
    /// without them (glibc on most distributions).
    Fp,
    /// Unwind with the binaries' .eh_frame: complete stacks, in the kernel
    /// program with tables built from it, or here from a copy of the top of
    /// the user stack (`--unwinder`).
    Dwarf,
    /// dwarf (`--unwinder auto`); fp only where this kernel refuses the
    /// in-kernel unwinder and the events are too many to copy each stack.
    Auto,
}

/// User-stack arguments of the tools that print user stacks.
#[derive(Debug, Clone, Args)]
pub struct StackArgs {
    /// How user stacks are taken: fp, dwarf or auto.
    #[arg(long, value_enum, default_value_t = StackMode::Auto)]
    pub stack_mode: StackMode,
    /// dwarf: bytes of user stack copied per event (512 to 65536).
    #[arg(long, default_value_t = 16384, value_parser = parse_stack_size)]
    pub stack_size: u32,
    /// dwarf: copy the stack of one event in N; counts by stack become estimates.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub sample: u32,
    /// dwarf: where stacks are unwound: in the kernel program, with tables
    /// built from each file's .eh_frame (every event, nothing copied), or
    /// here, from a copy of the stack sent per event. auto: in the kernel,
    /// except with --sample and for rare events traced system-wide (brk,
    /// mmap, OOM kills: a process's first events come before its table, and
    /// a copy is complete); where this kernel refuses the unwinder, copied
    /// for rare events and frame pointers for the rest.
    #[arg(long, value_enum, default_value_t = Unwinder::Auto)]
    pub unwinder: Unwinder,
    /// dwarf in the kernel: bytes of locked kernel memory for unwind tables
    /// (4 bytes a row, each rule kept once; files that do not fit are left
    /// out, counted).
    #[arg(long, default_value = "32M", value_parser = parse_table_size)]
    pub unwind_table_size: u32,
}

/// Where `--stack-mode dwarf` unwinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Unwinder {
    Auto,
    Kernel,
    Copy,
}

/// `--unwind-table-size`, in 8-byte entries of the row array (two rows or
/// page starts each).
pub fn parse_table_size(s: &str) -> Result<u32, String> {
    match parse_size(s) {
        Ok(n) if (64 << 10..=1 << 30).contains(&n) => Ok((n / 8) as u32),
        _ => Err(format!("'{s}' is not a table size from 64K to 1G")),
    }
}

impl StackArgs {
    /// Whether to unwind with DWARF (before this kernel had a say).
    pub fn dwarf(&self) -> bool {
        match self.stack_mode {
            StackMode::Fp => false,
            StackMode::Dwarf => true,
            StackMode::Auto => true,
        }
    }

    /// What `auto` falls back to where this kernel refuses the in-kernel
    /// unwinder: a copy per event for rare events, frame pointers for the
    /// rest (a copy per fault costs microseconds).
    pub fn refused_fallback_is_fp(&self, rare: bool) -> bool {
        self.stack_mode == StackMode::Auto && !rare && self.sample == 1
    }

    /// Whether DWARF stacks are unwound in the kernel program (before this
    /// kernel had a say): every event, so never with `--sample`.
    pub fn in_kernel(&self, rare: bool, system_wide: bool) -> bool {
        self.dwarf()
            && self.sample == 1
            && match self.unwinder {
                Unwinder::Kernel => true,
                Unwinder::Copy => false,
                // System-wide, every process's first events come before
                // memtrace has read its maps: rare events (a process's few
                // brk calls, all at start-up) would mostly find no table,
                // and copying them costs little.
                Unwinder::Auto => !(rare && system_wide),
            }
    }
}

pub fn parse_stack_size(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if (512..=65536).contains(&n) => Ok(n & !7),
        _ => Err(format!("'{s}' is not a stack size from 512 to 65536 bytes")),
    }
}

/// Interval and count, the same for every tool that reports per interval:
/// `-i SECS` and `--count N`, or `INTERVAL [COUNT]` as BCC's and
/// bpftrace's tools take them.
#[derive(Debug, Clone, Default, Args)]
pub struct IntervalArgs {
    /// Print every this many seconds (e.g. 1, 500ms).
    #[arg(short = 'i', long = "interval", value_parser = parse_duration)]
    pub interval: Option<Duration>,
    /// Stop after this many intervals.
    #[arg(long = "count")]
    pub count: Option<u64>,
    /// INTERVAL, as `-i`.
    #[arg(value_name = "INTERVAL", value_parser = parse_duration, conflicts_with = "interval")]
    pub interval_pos: Option<Duration>,
    /// COUNT, as `--count`.
    #[arg(value_name = "COUNT", conflicts_with = "count")]
    pub count_pos: Option<u64>,
}

impl IntervalArgs {
    pub fn every(&self) -> Option<Duration> {
        self.interval.or(self.interval_pos)
    }
    pub fn limit(&self) -> Option<u64> {
        self.count.or(self.count_pos)
    }
}

/// A size in bytes: "512M", "5MiB", "1G", "4096"; K/M/G/T are powers of 1024.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let num_end = lower
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(lower.len());
    let (num, unit) = lower.split_at(num_end);
    let mult: u64 = match unit.trim() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("'{s}' is not a size (try 512K, 8M, 1G)")),
    };
    match num.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok((v * mult as f64) as u64),
        _ => Err(format!("'{s}' is not a size (try 512K, 8M, 1G)")),
    }
}

/// A ring-buffer size, rounded up to a power of two, between a page and 1 GiB.
pub fn parse_buffer_size(s: &str) -> Result<u32, String> {
    let bytes = parse_size(s)?.next_power_of_two();
    if !(4096..=1 << 30).contains(&bytes) {
        return Err(format!("'{s}' is out of range (4K to 1G)"));
    }
    Ok(bytes as u32)
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
        // Below a millisecond nothing is measured: `-d 1e-300` is a typo.
        Ok(v) if v.is_finite() && v * mult_ms >= 1.0 => {
            Ok(Duration::from_micros((v * mult_ms * 1000.0) as u64))
        }
        _ => Err(format!("'{s}' is not a duration (try 10, 10s, 500ms, 2m)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_sizes_round_up_to_a_power_of_two() {
        assert_eq!(parse_buffer_size("512K"), Ok(512 << 10));
        assert_eq!(parse_buffer_size("3m"), Ok(4 << 20));
        assert_eq!(parse_buffer_size("1G"), Ok(1 << 30));
        assert_eq!(parse_buffer_size("5000"), Ok(8192));
        assert!(parse_buffer_size("1K").is_err());
        assert!(parse_buffer_size("2G").is_err());
        assert!(parse_buffer_size("lots").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("1e-300").is_err());
        assert!(parse_duration("0.000001").is_err());
        assert_eq!(parse_duration("1ms").unwrap(), Duration::from_millis(1));
    }

    #[test]
    fn pids() {
        assert!(parse_pid("0").is_err());
        assert!(parse_pid("abc").is_err());
        assert_eq!(parse_pid("42").unwrap(), 42);
    }

    #[test]
    fn stack_sizes() {
        assert_eq!(parse_stack_size("16384").unwrap(), 16384);
        assert_eq!(parse_stack_size("1001").unwrap(), 1000);
        assert!(parse_stack_size("100").is_err());
        assert!(parse_stack_size("1000000").is_err());
    }
}
