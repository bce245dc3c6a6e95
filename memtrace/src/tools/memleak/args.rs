//! memleak's arguments: what is shown, which allocator, how it is probed
//! and sampled.

use std::path::PathBuf;
use std::time::Duration;

use crate::run::args::IntervalArgs;
use crate::stacks::args::{parse_size, StackArgs};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Sort {
    Size,
    Count,
}

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::run::args::Common,
    #[command(flatten)]
    pub interval: IntervalArgs,
    /// Show the N stacks holding most (text: 10 unless given; JSON, folded
    /// output and records carry every stack unless given). What the others
    /// hold is said.
    #[arg(long)]
    pub top: Option<usize>,
    /// Order stacks by outstanding bytes or allocations.
    #[arg(long, value_enum, default_value_t = Sort::Size)]
    pub sort: Sort,
    /// Only allocations older than this (milliseconds, or 2s, 1m).
    #[arg(short = 'o', long = "older", value_parser = parse_age)]
    pub older: Option<Duration>,
    /// Ignore allocations smaller than this (bytes, or 4K, 1M).
    #[arg(short = 'z', long = "min-size", value_parser = parse_size)]
    pub min_size: Option<u64>,
    /// Ignore allocations larger than this.
    #[arg(short = 'Z', long = "max-size", value_parser = parse_size)]
    pub max_size: Option<u64>,
    /// Also show, per stack, allocations made and freed (churn), not only
    /// what is outstanding.
    #[arg(long)]
    pub all: bool,
    /// Print stacks folded, weighted by outstanding bytes, for flame graphs.
    #[arg(long)]
    pub folded: bool,
    /// The allocator's object (a jemalloc or tcmalloc library, a static
    /// binary); default: the libc the process maps.
    #[arg(short = 'O', long = "object")]
    pub object: Option<PathBuf>,
    /// Prefix of the allocator's function names (jemalloc `je_`, mimalloc `mi_`).
    #[arg(long, default_value = "")]
    pub symbol_prefix: String,
    /// Sample allocations, one per N bytes allocated on average (an
    /// allocation of s bytes with chance 1 - e^(-s/N)), each weighted by the
    /// inverse of its chance: cheaper, and the report is an unbiased
    /// estimate (marked ~; its error is in the README).
    #[arg(long, value_parser = parse_size)]
    pub sample_bytes: Option<u64>,
    /// Add kernel stacks to user-mode stacks.
    #[arg(long)]
    pub kernel_stacks: bool,
    /// Probe every function at its first instruction, as other tools do
    /// (to measure what the placement saves).
    #[arg(long, hide = true)]
    pub probe_at_entry: bool,
    /// With -c, probe glibc's allocator with uprobes instead of preloading
    /// memtrace's shim into the command (the shim is cheaper: see the README).
    #[arg(long)]
    pub no_preload: bool,
    /// With -p, probe the allocator with uprobes instead of loading
    /// memtrace's shim into the running process (ptrace, then dlopen in
    /// it) and pointing its allocator calls at it until memtrace ends.
    #[arg(long)]
    pub no_inject: bool,
    /// Never attach by a uprobe session or uprobe_multi link (to measure
    /// and test the uprobe + uretprobe fallback on kernels that have them).
    #[arg(long, hide = true)]
    pub no_uprobe_session: bool,
    /// Live allocations tracked at most (a full table is counted as map_full).
    #[arg(long, default_value_t = DEFAULT_MAX_ALLOCS, hide = true)]
    pub max_allocs: u32,
    /// Stacks the kernel's table of totals holds (entries are allocated as
    /// stacks appear). Tests shrink it.
    #[arg(long, default_value_t = DEFAULT_MAX_STACKS, hide = true)]
    pub max_stacks: u32,
    /// Totals by stack of exited processes kept before they fold into one
    /// per process. Tests shrink it.
    #[arg(long, hide = true, default_value_t = crate::stacks::kept::MAX_KEPT)]
    pub max_kept: usize,
    #[command(flatten)]
    pub stacks: StackArgs,
}

pub const DEFAULT_MAX_ALLOCS: u32 = 1 << 20;
/// A `python3 -c` started through pyenv's shell shims makes more than
/// 16,384 distinct complete (DWARF) stacks: a table of that size left
/// 11,418 of its 81,000 calls out (counted as map_full).
pub const DEFAULT_MAX_STACKS: u32 = 1 << 18;

/// `-o 500` is 500 ms, as BCC takes it; units as elsewhere.
fn parse_age(s: &str) -> std::result::Result<Duration, String> {
    match s.parse::<u64>() {
        Ok(ms) => Ok(Duration::from_millis(ms)),
        Err(_) => crate::run::args::parse_duration(s),
    }
}

impl Args {
    /// The flags of the figures a report's rows carry.
    pub fn figures(&self) -> crate::output::AllocFigures {
        crate::output::AllocFigures {
            churn: self.all,
            estimated: self.sample_bytes.is_some(),
            by_bytes: self.sort == Sort::Size,
            ..Default::default()
        }
    }
}
