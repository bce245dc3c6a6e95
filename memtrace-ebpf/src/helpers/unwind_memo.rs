//! The in-kernel unwinder's memo: the last complete stack this CPU unwound,
//! with every word of user stack the unwind read. An unwind that starts
//! from the same registers in the same process, and finds each of those
//! words unchanged in its copy of the stack, would read the same words,
//! apply the same rows and end with the same frames: it takes the memo's
//! result instead (a loop allocating from one place unwinds once). The
//! frames stay in the walk's scratch, which nothing else wrote since (any
//! other writer of it drops the memo), for `store_user_stack`. A memo is
//! good only while no process table changed (`UNWIND_GEN`, which userspace
//! bumps with each): as the rows cache, it never outlives the rows it used.
// Unused in the compat build: the compat object has no in-kernel unwinder.
#![cfg_attr(feature = "compat", allow(dead_code))]

use aya_ebpf::{
    bindings::BPF_F_MMAPABLE,
    cty::c_void,
    helpers::generated::bpf_loop,
    macros::map,
    maps::{Array, PerCpuArray},
};

use super::walk::{WALK_SCRATCH, WINDOW};

/// Reads kept: two a frame (its return address and saved rbp).
const READS: usize = 256;

#[repr(C)]
pub struct UnwindMemo {
    /// 1 when the rest describes the stack in the walk's scratch.
    valid: u64,
    /// `UNWIND_GEN` when it was made.
    pub(crate) gen: u64,
    tgid: u64,
    pub(crate) ip: u64,
    sp: u64,
    pub(crate) bp: u64,
    /// `memtrace_unwind_user_stack`'s result for it.
    result: u64,
    /// Reads recorded; past `READS`, or a read from outside the copy, the
    /// unwind is not kept.
    pub(crate) n: u64,
    spoiled: u64,
    pub(crate) reads: [[u64; 2]; READS],
}

/// The generation of the last process table userspace published. Mapped
/// by memleak's shim too (its memo of a stack holds as long as this one).
#[map]
static UNWIND_GEN: Array<u32> = Array::with_max_entries(1, BPF_F_MMAPABLE);

#[inline(always)]
fn tables_gen() -> u64 {
    UNWIND_GEN.get(0).map_or(0, |g| *g as u64)
}

#[map]
static UNWIND_MEMO: PerCpuArray<UnwindMemo> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's memo (None only if the map has no slot).
#[inline(always)]
fn memo() -> Option<*mut UnwindMemo> {
    UNWIND_MEMO.get_ptr_mut(0)
}

/// An unwind from `ip`/`sp`/`bp` begins: its reads are recorded from here
/// on (and the frames it writes are no longer the memo's). The memo is
/// looked up here and in `keep`, not held by the unwinder: a pointer kept
/// across its loop takes a slot of its stack, which the chain of calls
/// has no room for on 6.1.
#[inline(always)]
pub(super) fn begin(tgid: u32, ip: u64, sp: u64, bp: u64) {
    let Some(m) = memo() else {
        return;
    };
    let m = unsafe { &mut *m };
    m.valid = 0;
    m.gen = tables_gen();
    m.tgid = tgid as u64;
    m.ip = ip;
    m.sp = sp;
    m.bp = bp;
    m.n = 0;
    m.spoiled = 0;
}

/// The unwind ended complete with `result`: kept unless spoiled.
#[inline(always)]
pub(super) fn keep(result: u64) {
    if let Some(m) = memo() {
        let m = unsafe { &mut *m };
        m.result = result;
        m.valid = (m.spoiled == 0) as u64;
    }
}

/// The memo, when it holds the unwind just made for process `tgid` with
/// `stack` (the stack id and check, the check's low bit set as
/// `capture_stacks` sets it).
#[inline(always)]
pub(crate) fn held(tgid: u32, stack: u64) -> Option<&'static UnwindMemo> {
    let m = unsafe { &*memo()? };
    let same = m.result | 1 == stack;
    (m.valid != 0 && m.tgid == tgid as u64 && same && m.gen == tables_gen()).then_some(m)
}

/// The walk's scratch frames are about to be written by another walk.
#[inline(always)]
pub(super) fn forget() {
    if let Some(m) = memo() {
        unsafe { (*m).valid = 0 };
    }
}

/// A word the unwind read from its copy of the stack; past `READS`, the
/// unwind is not kept.
#[inline(always)]
pub(super) fn record(addr: u64, v: u64) {
    let Some(m) = memo() else {
        return;
    };
    let m = unsafe { &mut *m };
    let i = m.n as usize;
    if i < READS {
        m.reads[i] = [addr, v];
        m.n = i as u64 + 1;
    } else {
        m.spoiled = 1;
    }
}

/// A word read from outside the copy: not checkable later.
#[inline(always)]
pub(super) fn spoil() {
    if let Some(m) = memo() {
        unsafe { (*m).spoiled = 1 };
    }
}

/// `recall`'s answer when the memo does not hold (a result never is: its
/// stack id has its top bit clear).
pub(super) const NO_RECALL: u64 = u64::MAX;

/// What `check_reads` compares, on `recall`'s stack.
#[repr(C)]
struct Check {
    memo: *const UnwindMemo,
    buf: *const u8,
    base: u64,
    len: u64,
    ok: u64,
}

/// Reads compared per `bpf_loop` step: the loop's fixed cost per step is
/// paid once for several.
const PER_STEP: usize = 8;

/// `bpf_loop` step `k`: the memo's reads `PER_STEP * k..` against the copy.
#[inline(never)]
extern "C" fn check_reads(k: u32, ctx: *mut c_void) -> i64 {
    let c = unsafe { &mut *(ctx as *mut Check) };
    let m = unsafe { &*c.memo };
    for j in 0..PER_STEP {
        let i = k as usize * PER_STEP + j;
        if i as u64 >= m.n {
            return 1;
        }
        let [addr, v] = m.reads[i & (READS - 1)];
        let off = addr.wrapping_sub(c.base);
        if addr & 7 != 0 || off + 8 > c.len || off >= WINDOW as u64 {
            c.ok = 0;
            return 1;
        }
        // 8-aligned in an 8-aligned buffer, within the window.
        let got = unsafe { (c.buf.add(off as usize & (WINDOW - 1)) as *const u64).read() };
        if got != v {
            c.ok = 0;
            return 1;
        }
    }
    0
}

/// The memo's result, if an unwind from these registers, over the copy of
/// `len` bytes of the stack from `sp` (8-aligned down) in the walk's
/// scratch, would end with it; else `NO_RECALL`. A function of its own: its
/// stack is not on the unwinder's chain of calls, which 6.1 and 6.12 hold
/// to 512 bytes.
#[inline(never)]
pub(super) fn recall(tgid: u32, ip: u64, sp: u64, bp: u64, len: u64) -> u64 {
    let (Some(m), Some(s)) = (memo(), WALK_SCRATCH.get_ptr(0)) else {
        return NO_RECALL;
    };
    let m = unsafe { &*m };
    if m.valid == 0 || m.tgid != tgid as u64 || m.ip != ip {
        return NO_RECALL;
    }
    if m.sp != sp || m.bp != bp || m.gen != tables_gen() || m.n > READS as u64 {
        return NO_RECALL;
    }
    let mut c = Check {
        memo: m,
        buf: unsafe { (*s).stack.as_ptr() },
        base: sp & !7,
        len,
        ok: 1,
    };
    let steps = (m.n as u32).div_ceil(PER_STEP as u32);
    unsafe {
        bpf_loop(
            steps,
            check_reads as *mut c_void,
            &mut c as *mut Check as *mut c_void,
            0,
        )
    };
    if c.ok != 0 {
        m.result
    } else {
        NO_RECALL
    }
}
