//! What memleak's preloaded shim (memtrace/preload/) and the kernel
//! programs share beyond its probe sites: the memo through which an exact
//! allocation from a stack already unwound stays in the process, and the
//! entries of a thread's batch. Mirrored in C in memtrace/preload/shim.h.
//!
//! The kernel program, having unwound an allocation's stack at the shim's
//! site, publishes in `ML_MEMO` (a memory-mapped array the shim maps
//! read-only) the words of user stack that unwind read with their values.
//! The shim's next allocation from the same thread and frame finds that
//! slot, compares those words with its stack (a few ns), and when all are
//! unchanged the unwind would end the same: it queues the allocation with
//! that stack in its batch instead of trapping. The kernel applies the
//! batch in order when it is reported, as it did the frees.

use crate::memleak::AllocKey;
use crate::stacks::StackKey;

crate::pod!(ShimMemo, BatchEntry);

/// Slots of the memo, a power of two (each `ShimMemo` is 2 KiB: 4 MiB).
pub const MEMO_SLOTS: u32 = 2048;
/// Words a slot holds: two a frame, so stacks of up to 61 frames.
pub const MEMO_READS: usize = 122;

/// One published unwind. `seq` is odd while the kernel writes it (a
/// seqlock: the shim reads it before and after).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ShimMemo {
    pub seq: u64,
    /// Writers in the slot (atomic adds): one writes, the others pass.
    pub busy: u64,
    /// The thread whose unwind it is (low 32 bits) and its process (high):
    /// the shim takes only its own process's slots (a thread number can be
    /// another process's since).
    pub tid: u64,
    /// The frame pointer at the site (the shim's exported function's frame).
    pub bp: u64,
    /// The site's address (its generation) and the shim's function that
    /// called it (`kind`, the site's origin argument's high bits).
    pub site: u64,
    pub kind: u64,
    /// `UNWIND_GEN` when it was unwound: a table pushed since voids it.
    pub gen: u64,
    /// The stack's id (high 32 bits) and its check.
    pub stack: u64,
    pub n: u64,
    /// (address, value) of each word read at or above `bp`.
    pub reads: [[u64; 2]; MEMO_READS],
}

/// Slots a thread's frames share (its group's, so that they can all be
/// dropped when it exits).
pub const MEMO_WAYS: u32 = 8;

/// Where a thread's memo of frame `bp` is: its group's way for the frame.
#[inline(always)]
pub fn memo_slot(tid: u32, bp: u64) -> u32 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let group = ((tid as u64).wrapping_mul(K) >> 40) as u32 & (MEMO_SLOTS / MEMO_WAYS - 1);
    let way = ((bp >> 4).wrapping_mul(K) >> 60) as u32 & (MEMO_WAYS - 1);
    group * MEMO_WAYS + way
}

/// The shim's kinds of allocation site call (in the origin argument's bits
/// from `KIND_SHIFT`): the memo holds for the function that trapped.
pub const KIND_SHIFT: u32 = 8;

/// An entry of a thread's batch: a free (`stack` 0) at `ts_ns`, or an
/// allocation (`stack` with `ALLOCATED` set: the id and check below it) of
/// `size` bytes, made at `ts_ns`; an allocation the thread freed before the
/// batch was reported has `addr` 0 (its figures only).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchEntry {
    pub addr: u64,
    pub ts_ns: u64,
    pub size: u64,
    pub stack: u64,
}

pub const ALLOCATED: u64 = 1 << 63;

/// Batched frees that found no block (`ML_EARLY_FREES`, by block: the time
/// of the free): its allocation may still be in another thread's batch.
pub const EARLY_FREES: u32 = 16384;
/// Frees kept by block (a power of two).
pub const EARLY_TIMES: usize = 4;

/// The stack key of a batched allocation by process `tgid`.
#[inline(always)]
pub fn entry_key(tgid: u32, stack: u64) -> StackKey {
    StackKey {
        tgid,
        ustack: (stack >> 32) as u32 as i32 & 0x7fff_ffff,
        kstack: -1,
        ustack_check: stack as u32,
        gen: 0,
        forked: 0,
    }
}

crate::names! {
    maps {
        ML_MEMO: u32 => ShimMemo, OnDemand;
        ML_EARLY_FREES: AllocKey => [u64; EARLY_TIMES], OnDemand;
    }
    globals {}
    progs {}
}
