//! Empty programs, for `--floor`: what running any program on a tracepoint
//! costs, the floor the benchmarks measure the tools against.

use aya_ebpf::{
    macros::{raw_tracepoint, tracepoint},
    programs::{RawTracePointContext, TracePointContext},
};

#[tracepoint]
pub fn floor_tp(_ctx: TracePointContext) -> u32 {
    0
}

#[raw_tracepoint]
pub fn floor_raw(_ctx: RawTracePointContext) -> i32 {
    0
}
