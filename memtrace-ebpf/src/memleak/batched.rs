//! Allocations in the shim's batches (memtrace-common's `shim`): made at
//! the time they carry, with the stack the shim took from the memo, and
//! applied when the batch is reported, possibly after another thread's
//! batch that freed the block (`ML_EARLY_FREES`) or after the address was
//! handed out again (a newer block in the table). Either way the block is
//! gone: it counts as allocated and freed. A block the thread itself freed
//! before its batch went comes as figures only (address 0: `ts_ns` blocks
//! of `size` bytes in all).
// Unused in the compat build: without the in-kernel unwinder there is no
// memo, so its batches hold frees only.
#![cfg_attr(feature = "compat", allow(dead_code))]

use aya_ebpf::{helpers::bpf_get_current_comm, macros::map, maps::LruHashMap};
use memtrace_common::{
    memleak::{counter, origin, AllocInfo, AllocKey, AllocStats},
    shim::{entry_key, BatchEntry, EARLY_TIMES},
    stacks::StackKey,
    TASK_COMM_LEN,
};

use super::{add, bump, keep, release_if, tally, tally_freed, Released, ML_BLOCK, ML_STACKS, USER};
use crate::helpers::count_refused;

/// `shim::EARLY_FREES` with the memo: by block, the times of frees that may
/// be of an allocation still in a batch (0: none), a few, for an address
/// handed from thread to thread.
#[map]
static ML_EARLY_FREES: LruHashMap<AllocKey, [u64; EARLY_TIMES]> =
    LruHashMap::with_max_entries(1, 0);

/// A free at `ts` of the block at `k` that may be of an allocation still in
/// another thread's batch (it found no block; or, other threads having
/// batches, the one it released may have been an older block at the same
/// address): kept for that allocation, in place of the oldest kept.
#[inline(always)]
pub(super) fn freed_early(k: &AllocKey, ts: u64) {
    if let Some(v) = ML_EARLY_FREES.get_ptr_mut(k) {
        let v = unsafe { &mut *v };
        let mut at = 0;
        for i in 1..EARLY_TIMES {
            if v[i] < v[at] {
                at = i;
            }
        }
        v[at] = ts;
        return;
    }
    let mut v = [0; EARLY_TIMES];
    v[0] = ts;
    let _ = ML_EARLY_FREES.insert(k, &v, 0);
}

/// Whether a free kept for `k` came at or after `ts` (the first such is its
/// allocation's: the block was live until then): taken if so.
#[inline(always)]
fn take_early(k: &AllocKey, ts: u64) -> bool {
    let Some(v) = ML_EARLY_FREES.get_ptr_mut(k) else {
        return false;
    };
    let v = unsafe { &mut *v };
    let mut at = EARLY_TIMES;
    for i in 0..EARLY_TIMES {
        if v[i] >= ts && v[i] != 0 && (at == EARLY_TIMES || v[i] < v[at & (EARLY_TIMES - 1)]) {
            at = i;
        }
    }
    if at == EARLY_TIMES {
        return false;
    }
    v[at & (EARLY_TIMES - 1)] = 0;
    true
}

/// A batched free (`e.size` 1: the process has other threads with
/// batches): applied to a block allocated before it, kept when it found
/// none or others' batches may hold a newer block.
#[inline(always)]
pub(super) fn batched_free(tgid: u32, e: &BatchEntry) {
    let k = AllocKey {
        addr: e.addr,
        tgid,
        origin: origin::USER,
    };
    match release_if(USER, &k, e.ts_ns) {
        Released::None => {
            bump(counter::FREE_UNKNOWN);
            freed_early(&k, e.ts_ns);
        }
        Released::Yes if e.size != 0 => freed_early(&k, e.ts_ns),
        _ => {}
    }
}

/// Applies a batched allocation of process `tgid`.
#[inline(always)]
pub(super) fn batched(tgid: u32, e: &BatchEntry) {
    let key = entry_key(tgid, e.stack);
    let pairs = if e.addr == 0 { e.ts_ns } else { 1 };
    add(counter::ALLOCS, pairs);
    add(counter::MEMOIZED, pairs);
    let Some(v) = stats(&key) else {
        return;
    };
    let v = unsafe { &mut *v };
    tally(v, pairs, e.size);
    if e.addr == 0 {
        freed(v, pairs, e.size);
        return;
    }
    let k = AllocKey {
        addr: e.addr,
        tgid,
        origin: origin::USER,
    };
    // Freed already, by a batch that came first.
    if take_early(&k, e.ts_ns) {
        bump(counter::FREED_EARLY);
        freed(v, 1, e.size);
        return;
    }
    // The address was handed out again since: this block went before.
    if let Some(old) = unsafe { USER.allocs.get(&k) } {
        if old.ts_ns > e.ts_ns {
            freed(v, 1, e.size);
            return;
        }
    }
    let Some(slot) = ML_BLOCK.get_ptr_mut(0) else {
        return;
    };
    let slot = unsafe { &mut *slot };
    slot.0 = k;
    slot.1 = AllocInfo {
        size: e.size,
        ts_ns: e.ts_ns,
        weight: 1,
        weight_bytes: e.size,
        stack: key,
    };
    keep(false);
}

/// `n` blocks of `bytes` in all freed, in the figures of their stack.
#[inline(always)]
fn freed(v: &mut AllocStats, n: u64, bytes: u64) {
    tally_freed(v, n, bytes);
    add(counter::FREES, n);
}

/// The figures of `key`, made if new (the stack itself was stored when the
/// allocation that published the memo trapped).
#[inline(always)]
fn stats(key: &StackKey) -> Option<*mut AllocStats> {
    if let Some(v) = ML_STACKS.get_ptr_mut(key) {
        return Some(v);
    }
    let v = AllocStats {
        allocs: 0,
        bytes: 0,
        frees: 0,
        freed_bytes: 0,
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
    };
    if let Err(e) = ML_STACKS.insert(key, &v, 0) {
        count_refused(e);
        return None;
    }
    ML_STACKS.get_ptr_mut(key)
}
