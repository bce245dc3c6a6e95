//! The flags every tool takes (`Common`), interval and count, and the
//! parsers of durations, sizes and pids: defined here, below the tools that
//! flatten them, and re-exported by `cli`.

use std::time::Duration;

use clap::Args;

use crate::session::attach::Method;
use crate::stacks::args::parse_size;

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
        // Past 64 bits of microseconds it would saturate and run forever.
        Ok(v) if v.is_finite() && v * mult_ms >= 1.0 && v * mult_ms * 1000.0 < u64::MAX as f64 => {
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
}
