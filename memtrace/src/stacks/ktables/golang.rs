//! Go binaries. The Go toolchain writes no `.eh_frame` for Go code: its
//! call frame information is in `.debug_frame` (compressed, and gone with
//! `-ldflags=-s -w`). What it always keeps, on amd64 and arm64, is frame
//! pointers: where `.debug_frame` is gone, the file's code is walked by
//! them, decided here for the file rather than for the run. The frames a
//! goroutine or thread starts from have no caller to find: the walk ends
//! there, complete, rather than on what lies above them.

use memtrace_common::kunwind::{row, UnwindRule};
use object::{Object, ObjectSymbol};

use super::build::Row;

pub(super) use crate::process::goheap::is_go;

/// The frame-pointer rule as a row: CFA = rbp + 16, the return address
/// below it, the caller's rbp saved at rbp.
pub(super) const FRAME_POINTERS: UnwindRule = UnwindRule {
    cfa_off: 16,
    rbp_off: -2,
    kind: row::RBP,
};

/// One span over each executable segment, walked by frame pointers.
pub(super) fn frame_pointer_spans(segments: &[(u64, u64, u64)]) -> Vec<(u64, u64, Row)> {
    segments
        .iter()
        .map(|&(_, size, vaddr)| {
            let r = Row {
                pc: vaddr as u32,
                rule: FRAME_POINTERS,
            };
            (vaddr, vaddr + size, r)
        })
        .collect()
}

/// Where every goroutine and thread starts: nothing above them is a frame.
pub(super) const TOP_FRAMES: [&str; 3] = ["runtime.goexit", "runtime.mstart", "runtime.rt0_go"];

/// Where Go switches to another stack (the thread's system stack, or C's
/// for cgo): the callers are above the old stack pointer, which the rows
/// cannot find. A walk stops there with a mark, not as complete.
pub(super) const SWITCHES: [&str; 4] = [
    "runtime.systemstack",
    "runtime.mcall",
    "runtime.morestack",
    "runtime.asmcgocall",
];

/// (start, end, name) of the file's functions named in `names` (an ABI
/// suffix ignored), by its symbols, or by `.gopclntab` when it is
/// stripped.
pub(super) fn functions<'d, R: object::ReadRef<'d>>(
    obj: &object::File<'d, R>,
    names: &[&str],
) -> Vec<(u64, u64, String)> {
    let mut v: Vec<(u64, u64, String)> = obj
        .symbols()
        .filter(|s| s.size() > 0)
        .filter_map(|s| {
            let n = s.name().ok()?;
            let n = n.strip_suffix(".abi0").unwrap_or(n);
            names
                .contains(&n)
                .then(|| (s.address(), s.address() + s.size(), n.to_string()))
        })
        .collect();
    if v.is_empty() && obj.symbols().next().is_none() {
        v = crate::stacks::gopclntab::functions_named(obj, names);
    }
    v.sort_unstable();
    v
}

/// Gives the code of `ranges` (sorted, disjoint) rule `kind` (the end of
/// a walk, or a stack switch) in place of what `spans` had there.
pub(super) fn set_rule(spans: &mut Vec<(u64, u64, Row)>, ranges: &[(u64, u64)], kind: u8) {
    if ranges.is_empty() {
        return;
    }
    let rule = UnwindRule {
        cfa_off: 0,
        rbp_off: 0,
        kind,
    };
    let marked: Vec<(u64, u64, Row)> = ranges
        .iter()
        .filter(|r| r.1 <= u32::MAX as u64)
        .map(|&(s, e)| (s, e, Row { pc: s as u32, rule }))
        .collect();
    // What lies outside them keeps its rows (a span over a whole segment,
    // walked by frame pointers, is cut around them).
    let mut rest = super::build::not_covered_parts(&marked, std::mem::take(spans));
    rest.extend(marked);
    *spans = rest;
}
