//! Probe groups several tools share (page faults, brk, file faults, reclaim,
//! rss_stat, OOM kills, syscalls, tracepoints chosen by name, process forks
//! and exec names, executable mappings learned in the kernel, allocators),
//! and the per-process snapshot top and serve read.

pub mod counters;
pub mod exemaps;
pub mod follow;
pub mod heap;
pub mod oom;
pub mod reclaim;
pub mod rssstat;
pub mod snapshot;
pub mod syscalls;
pub mod tpspec;
