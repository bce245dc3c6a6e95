//! The shim's memo (memtrace-common's `shim`): an exact allocation whose
//! stack the in-kernel unwinder just made from the shim's site is
//! published, by thread and frame, with the words of user stack that
//! unwind read, so that the shim's next allocation from that frame, on
//! finding them unchanged, queues itself with that stack in its batch
//! instead of trapping. A thread's slots go when it lets go of its batch
//! or exits.
// Unused in the compat build: it has no in-kernel unwinder to memoize.
#![cfg_attr(feature = "compat", allow(dead_code))]

use aya_ebpf::{
    bindings::BPF_F_MMAPABLE,
    helpers::generated::bpf_probe_read_kernel,
    macros::map,
    maps::{Array, HashMap},
};
use memtrace_common::shim::{memo_slot, ShimMemo, MEMO_READS, MEMO_WAYS};

use crate::helpers::unwind_memo;

/// `MEMO_SLOTS` when memleak serves the memo (a slot past the end is never
/// published).
#[map]
static ML_MEMO: Array<ShimMemo> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Publishes thread `tid`'s unwind for process `tgid` that ended with
/// `stack` (id and check), from the shim's function `kind`, if the memo
/// holds it (complete, from tables alone, every word it read checkable) and
/// the thread has a batch to queue into (`batches`: by thread).
#[inline(always)]
pub(super) fn publish(tid: u32, tgid: u32, stack: u64, kind: u64, batches: &HashMap<u32, u64>) {
    let Some(m) = unwind_memo::held(tgid, stack) else {
        return;
    };
    if m.n > MEMO_READS as u64 || unsafe { batches.get(&tid) }.is_none() {
        return;
    }
    let Some(slot) = ML_MEMO.get_ptr_mut(memo_slot(tid, m.bp)) else {
        return;
    };
    let s = unsafe { &mut *slot };
    // One writer at a time (another CPU's thread may share the slot): a
    // torn slot could name one thread with another's words.
    if !claim(s) {
        return;
    }
    let seq = s.seq | 1;
    write(&mut s.seq, seq);
    // tgid << 32 | tid, of the thread whose call this is.
    write(&mut s.tid, aya_ebpf::helpers::bpf_get_current_pid_tgid());
    write(&mut s.bp, m.bp);
    write(&mut s.site, m.ip);
    write(&mut s.kind, kind);
    write(&mut s.gen, m.gen);
    write(&mut s.stack, stack);
    // m.n is at most MEMO_READS (above): bounded for the verifier too.
    let len = core::hint::black_box(m.n as u32).min(MEMO_READS as u32) * 16;
    let ok = len > 0
        && unsafe {
            bpf_probe_read_kernel(s.reads.as_mut_ptr().cast(), len, m.reads.as_ptr().cast())
        } == 0;
    write(&mut s.n, if ok { m.n } else { 0 });
    // Left odd (unusable) when the copy failed.
    write(&mut s.seq, if ok { seq + 1 } else { seq });
    release(s);
}

/// Takes the slot for this writer: an atomic add (its result unused: the
/// one read-modify-write every BPF target has), then the count seen alone,
/// or the add taken back. Of writers that overlap, at most one sees 1.
#[inline(always)]
fn claim(s: &mut ShimMemo) -> bool {
    add(&mut s.busy, 1);
    if unsafe { core::ptr::read_volatile(&s.busy) } == 1 {
        return true;
    }
    release(s);
    false
}

#[inline(always)]
fn release(s: &mut ShimMemo) {
    add(&mut s.busy, u64::MAX);
}

#[inline(always)]
fn add(at: &mut u64, v: u64) {
    crate::helpers::atomic_add(at, v);
}

/// Thread `tid`'s slots go (its batch went, or it exited): a thread that
/// takes its number later must not find them.
#[inline(always)]
pub(super) fn forget(tid: u32) {
    let first = memo_slot(tid, 0) & !(MEMO_WAYS - 1);
    for w in 0..MEMO_WAYS {
        if let Some(slot) = ML_MEMO.get_ptr_mut(first + w) {
            let s = unsafe { &mut *slot };
            if s.tid as u32 == tid && claim(s) {
                let seq = s.seq | 1;
                write(&mut s.seq, seq);
                write(&mut s.tid, 0);
                write(&mut s.n, 0);
                write(&mut s.seq, seq + 1);
                release(s);
            }
        }
    }
}

/// A slot's word, written in program order with the others (volatile: the
/// shim reads the slot between two reads of `seq`; x86's stores are seen
/// in order, and only x86 has the unwinder that publishes).
#[inline(always)]
fn write(at: &mut u64, v: u64) {
    unsafe { core::ptr::write_volatile(at, v) };
}
