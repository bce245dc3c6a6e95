//! Where CPython keeps what memtrace reads, by version: the fields the
//! kernel program walks (`PyProc`) and those of code objects and strings
//! read here. Per version, from each version's own DWARF (`ptype /o` of
//! CPython 3.11.7, 3.12.1 and 3.13.0 as built with debug information), so
//! that a distribution's stripped interpreter is read the same way; the
//! layouts hold across a version's patch releases.

use memtrace_common::python::{PyProc, NONE};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// What the kernel program walks (its `runtime` set per process).
    pub walk: PyProc,
    pub co_firstlineno: u16,
    pub co_filename: u16,
    pub co_qualname: u16,
    pub co_linetable: u16,
    /// Where a code object's bytecode starts (`co_code_adaptive`).
    pub co_code: u16,
    /// `sizeof(PyASCIIObject)`: a compact ASCII string's text follows it.
    pub ascii_size: u16,
    /// `sizeof(PyCompactUnicodeObject)`: other compact strings' text.
    pub compact_size: u16,
}

/// Versions whose frames are walked.
pub const FIRST_MINOR: u32 = 11;
pub const LAST_MINOR: u32 = 13;

const LAYOUTS: [Layout; 3] = [
    Layout {
        walk: PyProc {
            runtime: 0,
            minor: 11,
            interp_main: 48,
            interp_threads: 16,
            ts_next: 8,
            ts_tid: 160,
            ts_frame: 56,
            cframe_frame: 8,
            f_code: 32,
            f_previous: 48,
            f_instr: 56,
            f_owner: 69,
            f_entry: 68,
            _pad: 0,
        },
        co_firstlineno: 72,
        co_filename: 112,
        co_qualname: 128,
        co_linetable: 136,
        co_code: 184,
        ascii_size: 48,
        compact_size: 72,
    },
    Layout {
        walk: PyProc {
            runtime: 0,
            minor: 12,
            interp_main: 48,
            interp_threads: 72,
            ts_next: 8,
            ts_tid: 144,
            ts_frame: 56,
            cframe_frame: 0,
            f_code: 0,
            f_previous: 8,
            f_instr: 56,
            f_owner: 70,
            f_entry: NONE,
            _pad: 0,
        },
        co_firstlineno: 68,
        co_filename: 112,
        co_qualname: 128,
        co_linetable: 136,
        co_code: 192,
        ascii_size: 40,
        compact_size: 56,
    },
    Layout {
        walk: PyProc {
            runtime: 0,
            minor: 13,
            interp_main: 640,
            interp_threads: 7344,
            ts_next: 8,
            ts_tid: 160,
            ts_frame: 72,
            cframe_frame: NONE,
            f_code: 0,
            f_previous: 8,
            f_instr: 56,
            f_owner: 70,
            f_entry: NONE,
            _pad: 0,
        },
        co_firstlineno: 68,
        co_filename: 112,
        co_qualname: 128,
        co_linetable: 136,
        co_code: 200,
        ascii_size: 40,
        compact_size: 56,
    },
];

/// The layout of CPython 3.`minor`, if memtrace has it.
pub fn layout(minor: u32) -> Option<&'static Layout> {
    LAYOUTS.iter().find(|l| l.walk.minor == minor)
}

impl Layout {
    /// What the kernel program needs for a process whose `_PyRuntime` is
    /// at `runtime`.
    pub fn proc(&self, runtime: u64) -> PyProc {
        PyProc {
            runtime,
            ..self.walk
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_walked_version_has_a_layout() {
        for m in FIRST_MINOR..=LAST_MINOR {
            let l = layout(m).expect("a layout");
            assert_eq!(l.walk.minor, m);
            // 3.11 marks a C call's outermost frame itself, later versions
            // by a frame of the C stack's.
            assert_eq!(l.walk.f_entry == NONE, m >= 12);
        }
        assert!(layout(10).is_none());
    }
}
