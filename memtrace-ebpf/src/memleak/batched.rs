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
    loss,
    memleak::{counter, origin, AllocInfo, AllocKey, AllocStats},
    shim::{entry_key, BatchEntry},
    stacks::StackKey,
    TASK_COMM_LEN,
};

use super::{add, bump, keep, ML_BLOCK, ML_STACKS, USER};
use crate::helpers::count_loss;

/// `shim::EARLY_FREES` with the memo.
#[map]
static ML_EARLY_FREES: LruHashMap<AllocKey, u64> = LruHashMap::with_max_entries(1, 0);

/// A batched free at `ts` found no block at `k`: kept for the batched
/// allocation that may still come.
#[inline(always)]
pub(super) fn freed_early(k: &AllocKey, ts: u64) {
    let _ = ML_EARLY_FREES.insert(k, &ts, 0);
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
    v.allocs += pairs;
    v.bytes += e.size;
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
    if let Some(&at) = unsafe { ML_EARLY_FREES.get(&k) } {
        let _ = ML_EARLY_FREES.remove(&k);
        if at >= e.ts_ns {
            bump(counter::FREED_EARLY);
            freed(v, 1, e.size);
            return;
        }
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
    v.frees += n;
    v.freed_bytes += bytes;
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
    if ML_STACKS.insert(key, &v, 0).is_err() {
        count_loss(loss::MAP_FULL);
        return None;
    }
    ML_STACKS.get_ptr_mut(key)
}
