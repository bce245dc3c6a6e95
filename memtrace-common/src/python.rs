//! CPython frames in user stacks: where a process's interpreter keeps its
//! threads and frames (`PyProc`, per process, from the interpreter's
//! version), and how the kernel program writes the Python frames it walks
//! into a stack's instruction pointers (`frame`), after the native ones.

/// Where one process's CPython keeps what the walk reads: `_PyRuntime`'s
/// address and the offsets of its version. An offset of `NONE` is a field
/// that version does not have.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProc {
    /// `_PyRuntime` in the process.
    pub runtime: u64,
    /// 3.x's minor version.
    pub minor: u32,
    /// `_PyRuntime.interpreters.main`.
    pub interp_main: u16,
    /// `PyInterpreterState.threads.head`.
    pub interp_threads: u16,
    /// `PyThreadState.next`.
    pub ts_next: u16,
    /// `PyThreadState.native_thread_id` (the thread's tid).
    pub ts_tid: u16,
    /// `PyThreadState.cframe` (3.11, 3.12) or `.current_frame` (3.13).
    pub ts_frame: u16,
    /// `_PyCFrame.current_frame`, or NONE where `ts_frame` is the frame.
    pub cframe_frame: u16,
    /// `_PyInterpreterFrame.f_code` (`f_executable` in 3.13).
    pub f_code: u16,
    pub f_previous: u16,
    /// `prev_instr` (the instruction running, 3.11 and 3.12) or
    /// `instr_ptr` (3.13).
    pub f_instr: u16,
    pub f_owner: u16,
    /// `is_entry` (3.11); NONE where an entry frame is a frame of its own
    /// that the C stack owns (`OWNED_BY_CSTACK`).
    pub f_entry: u16,
    pub _pad: u16,
}

/// A field the version does not have.
pub const NONE: u16 = u16::MAX;

/// `_PyInterpreterFrame.owner` of the frame each C call into the eval loop
/// pushes (3.12 on).
pub const OWNED_BY_CSTACK: u8 = 3;

/// Threads looked at in an interpreter's list, at most, to find the one
/// an event came from.
pub const MAX_THREADS: u32 = 64;

/// Python frames in a stack's instruction pointers, after the native ones
/// (and the mark a native unwind that stopped early ends with): first a
/// `BEGIN` word naming the process and version, then one word per Python
/// frame, innermost first. None of them is a user address or a `mark`.
pub mod frame {
    /// `BEGIN | minor << 32 | tgid`.
    pub const BEGIN: u64 = 0xC000_0000_0000_0000;
    pub const BEGIN_MASK: u64 = 0xFFFF_FF00_0000_0000;
    /// `TAG | ENTRY? | (code >> 3) << CODE_SHIFT | instruction`.
    pub const TAG: u64 = 0x8000_0000_0000_0000;
    pub const TAG_MASK: u64 = 0xC000_0000_0000_0000;
    /// The outermost frame of one C call of the eval loop: the frames
    /// from here in replace one native `_PyEval_EvalFrameDefault` frame.
    pub const ENTRY: u64 = 1 << 61;
    pub const CODE_SHIFT: u32 = 16;
    /// The code object's address, 8-aligned, in the bits below ENTRY.
    pub const CODE_BITS: u64 = (1 << 45) - 1;
    /// The instruction, in code units from the code object's start;
    /// `NO_INSTR` when it was not in range.
    pub const INSTR_MASK: u64 = 0xffff;
    pub const NO_INSTR: u64 = INSTR_MASK;

    pub const fn begin(minor: u32, tgid: u32) -> u64 {
        BEGIN | ((minor as u64 & 0xff) << 32) | tgid as u64
    }

    pub const fn is_begin(w: u64) -> bool {
        w & BEGIN_MASK == BEGIN
    }

    pub const fn is_frame(w: u64) -> bool {
        w & TAG_MASK == TAG
    }

    pub const fn encode(code: u64, instr: u64, entry: bool) -> u64 {
        let e = if entry { ENTRY } else { 0 };
        TAG | e | (((code >> 3) & CODE_BITS) << CODE_SHIFT) | (instr & INSTR_MASK)
    }

    /// (code object address, instruction, entry).
    pub const fn decode(w: u64) -> (u64, u64, bool) {
        (
            ((w >> CODE_SHIFT) & CODE_BITS) << 3,
            w & INSTR_MASK,
            w & ENTRY != 0,
        )
    }
}

/// How each walk of a Python thread ended (`PY_STATS`).
pub mod stat {
    /// Python frames were added to the stack.
    pub const WALKED: u32 = 0;
    /// The event's thread has no Python thread state (a thread Python
    /// did not start, or one past `MAX_THREADS`).
    pub const NO_THREAD: u32 = 1;
    /// A read of the interpreter's memory failed: the frames read up to it
    /// are kept.
    pub const READ_FAIL: u32 = 2;
    /// No room left in the stack for all of its Python frames.
    pub const TRUNCATED: u32 = 3;
    /// The thread runs no Python frame.
    pub const NO_FRAME: u32 = 4;
    pub const NR: u32 = 5;
    pub const NAMES: [&str; NR as usize] = [
        "python_stacks_walked",
        "python_no_thread",
        "python_read_fail",
        "python_truncated",
        "python_no_frame",
    ];
}

crate::names! {
    maps {
        PY_PROCS: u32 => PyProc, OnDemand;
        PY_THREADS: u32 => u64, OnDemand;
        PY_STATS: u32 => u64, Compiled;
        PY_STEP: () => (), Compiled;
    }
    globals {}
    progs {}
}

crate::pod!(PyProc);

#[cfg(test)]
mod tests {
    use super::frame::*;

    #[test]
    fn a_frame_word_round_trips_and_is_neither_address_nor_mark() {
        let code = 0x7f12_3456_7890u64 & !7;
        let w = encode(code, 1234, true);
        assert_eq!(decode(w), (code, 1234, true));
        assert!(is_frame(w) && !is_begin(w));
        assert!(w > 1 << 48 && w < 0xffff_ffff_ffff_ff00);
        let b = begin(12, 4242);
        assert!(is_begin(b) && !is_frame(b));
        assert_eq!(b & 0xffff_ffff, 4242);
        assert_eq!((b >> 32) & 0xff, 12);
    }
}
