//! The in-kernel unwinder's copy of the user stack: the top of it read
//! once, each frame's words taken from there (and recorded for the memo).
// Unused in the compat build: the compat object has no in-kernel unwinder.
#![cfg_attr(feature = "compat", allow(dead_code))]

use aya_ebpf::{cty::c_void, helpers::generated::bpf_probe_read_user};

use super::{unwind_memo, walk::WINDOW};

/// The top of the user stack copied once (most frames' words are read from
/// there), from `base` for `len` bytes.
pub(super) struct Copy {
    pub(super) buf: *mut u8,
    pub(super) base: u64,
    pub(super) len: u64,
}

impl Copy {
    /// The word at `addr`: from the copy when it is there, else read into
    /// the slot just past it. Either way one load from the buffer: a path
    /// that kept the word on the stack instead made the verifier's states
    /// differ at every frame, and it gave up.
    #[inline(always)]
    pub(super) fn word(&self, addr: u64) -> Option<u64> {
        let off = addr.wrapping_sub(self.base);
        // The words read are recorded for the memo (`unwind_memo`).
        let at = if addr & 7 == 0 && off + 8 <= self.len && off < WINDOW as u64 {
            let at = off as usize & (WINDOW - 1);
            unwind_memo::record(addr, unsafe { (self.buf.add(at) as *const u64).read() });
            at
        } else {
            unwind_memo::spoil();
            let r = unsafe {
                bpf_probe_read_user(
                    self.buf.add(WINDOW) as *mut c_void,
                    8,
                    addr as *const c_void,
                )
            };
            if r != 0 {
                return None;
            }
            WINDOW
        };
        // 8-aligned in an 8-aligned buffer: one load.
        Some(unsafe { (self.buf.add(at) as *const u64).read() })
    }

    /// The word at `addr`, not recorded for the memo until it is used
    /// (`unwind_memo::record`); a word from outside the copy cannot be, so
    /// it spoils the memo at once.
    #[inline(always)]
    pub(super) fn peek(&self, addr: u64) -> Option<u64> {
        let off = addr.wrapping_sub(self.base);
        if addr & 7 == 0 && off + 8 <= self.len && off < WINDOW as u64 {
            let at = off as usize & (WINDOW - 1);
            return Some(unsafe { (self.buf.add(at) as *const u64).read() });
        }
        self.word(addr)
    }

    /// One read of the stack in use into `buf`, from `sp` (8-aligned down)
    /// up to `top`, the main thread's stack top (a thread's top is unknown:
    /// the rest of sp's page), far cheaper than a read per word. `len` is
    /// 0 when the read failed (every word is then read on its own).
    #[inline(always)]
    pub(super) fn take(buf: *mut u8, sp: u64, top: u64) -> Copy {
        let base = sp & !7;
        let mut want = if top > base {
            top - base
        } else {
            4096 - (base & 4095)
        };
        if want > WINDOW as u64 {
            want = WINDOW as u64;
        }
        // Opaque, so that LLVM keeps the bound as the walk's does (6.1).
        let want = core::hint::black_box(want);
        let mut copy = Copy { buf, base, len: 0 };
        if want <= WINDOW as u64
            && unsafe {
                bpf_probe_read_user(buf as *mut c_void, want as u32, base as *const c_void)
            } == 0
        {
            copy.len = want;
        }
        copy
    }
}
