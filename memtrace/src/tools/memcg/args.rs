//! memcg's arguments: the groups watched, the warnings, the prekill hook
//! and the heap.

use crate::run::args::IntervalArgs;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::run::args::Common,
    /// Watch this memory cgroup: a path (/a/b inside the hierarchy, or the
    /// directory) or a process id inside it. Repeatable; default: every
    /// group with a limit of its own.
    #[arg(long = "cgroup", value_name = "PATH|PID")]
    pub cgroups: Vec<String>,
    /// Print the table every this many seconds (default: once, at the end).
    #[command(flatten)]
    pub interval: IntervalArgs,
    /// Warn once when a group's usage reaches PCT percent of the limit in
    /// force (v1: the kernel's threshold notifier).
    #[arg(long, value_name = "PCT", value_parser = parse_pct)]
    pub warn: Option<f64>,
    /// Warn once when tasks of a group stall on memory PCT percent of a
    /// second (v2 PSI trigger): `some:PCT` or `full:PCT`.
    #[arg(long, value_name = "some|full:PCT", value_parser = parse_pressure)]
    pub warn_pressure: Option<(String, f64)>,
    /// Exit with code 3 after the first warning.
    #[arg(long)]
    pub fail: bool,
    /// Answer systemd-oomd's prekill calls (systemd 260+, with
    /// PrekillHookTimeoutSec= set): before oomd kills a group, print what
    /// is known of it (usage, limit, the processes that grew most and
    /// their stacks), then let oomd go on.
    #[arg(long)]
    pub prekill: bool,
    /// Where oomd looks for prekill hooks.
    #[arg(long, value_name = "DIR", default_value = super::prekill::DIR, requires = "prekill")]
    pub prekill_dir: std::path::PathBuf,
    /// Track the heap of the groups' processes (memleak's allocator
    /// probes, sampled): each warning and each OOM kill shows what the
    /// victim (or the processes that grew most) held, by stack.
    #[arg(long)]
    pub heap: bool,
    /// With --heap: one sample per N bytes allocated on average (each
    /// weighted by the inverse of its chance: an unbiased estimate); 0
    /// records every allocation.
    #[arg(long, value_name = "BYTES", default_value = "512K", value_parser = crate::stacks::args::parse_size_or_zero, requires = "heap")]
    pub heap_sample: u64,
    /// With --heap: uprobes on the allocator in every process that maps it
    /// (a trap, about 1 us, on every call) instead of the allocator shim
    /// loaded into the groups' processes (a few ns a call). Uprobes see a
    /// process that joins a group from its first call there; the shim,
    /// from the moment it is loaded (within a sampling tick).
    #[arg(long, requires = "heap")]
    pub no_inject: bool,
    #[command(flatten)]
    pub stacks: crate::stacks::args::StackArgs,
}

fn parse_pct(s: &str) -> std::result::Result<f64, String> {
    match s.trim_end_matches('%').parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 100.0 => Ok(v),
        _ => Err(format!("'{s}' is not a percentage from 0 to 100")),
    }
}

fn parse_pressure(s: &str) -> std::result::Result<(String, f64), String> {
    let (kind, pct) = s
        .split_once(':')
        .ok_or_else(|| format!("'{s}' is not some:PCT or full:PCT"))?;
    if kind != "some" && kind != "full" {
        return Err(format!("'{kind}' is neither some nor full"));
    }
    Ok((kind.to_string(), parse_pct(pct)?))
}
