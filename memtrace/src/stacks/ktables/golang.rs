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

/// Whether the file was built by the Go toolchain.
pub(super) fn is_go<'d, R: object::ReadRef<'d>>(obj: &object::File<'d, R>) -> bool {
    [".note.go.buildid", ".gopclntab", ".go.buildinfo"]
        .into_iter()
        .any(|s| obj.section_by_name(s).is_some())
}

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
/// (Not the stack switches, `runtime.systemstack` and `runtime.morestack`:
/// callers are above them, on another stack, and a walk stopped there would
/// be complete in name only.)
const TOP_FRAMES: [&str; 3] = ["runtime.goexit", "runtime.mstart", "runtime.rt0_go"];

/// (start, end) of the file's top frames, by its symbols (none when
/// stripped: the walk then ends where the words above stop being code).
pub(super) fn top_frames<'d, R: object::ReadRef<'d>>(obj: &object::File<'d, R>) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = obj
        .symbols()
        .filter(|s| s.size() > 0)
        .filter(|s| {
            s.name().is_ok_and(|n| {
                let n = n.strip_suffix(".abi0").unwrap_or(n);
                TOP_FRAMES.contains(&n)
            })
        })
        .map(|s| (s.address(), s.address() + s.size()))
        .collect();
    v.sort_unstable();
    v
}

/// Replaces the rows of `spans` inside a top frame by the end rule.
pub(super) fn end_at_top_frames(spans: &mut Vec<(u64, u64, Row)>, tops: &[(u64, u64)]) {
    if tops.is_empty() {
        return;
    }
    let inside = |a: u64, b: u64| tops.iter().any(|&(s, e)| a < e && s < b);
    spans.retain(|s| !inside(s.0, s.1));
    let end = UnwindRule {
        cfa_off: 0,
        rbp_off: 0,
        kind: row::END,
    };
    for &(s, e) in tops {
        if e <= u32::MAX as u64 {
            let r = Row {
                pc: s as u32,
                rule: end,
            };
            spans.push((s, e, r));
        }
    }
}
