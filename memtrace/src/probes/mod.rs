//! Probe groups several tools share (page faults, brk, file faults, reclaim,
//! rss_stat, OOM kills, syscalls, tracepoints chosen by name), the records
//! their kernel programs send, and the per-process snapshot top and serve read.

pub mod counters;
pub mod heap;
pub mod oom;
pub mod reclaim;
pub mod records;
pub mod rssstat;
pub mod snapshot;
pub mod syscalls;
pub mod tpspec;
