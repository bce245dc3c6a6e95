//! Records to userspace through the ring buffer, and the loss counters every
//! dropped or degraded event is counted in.

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    macros::map,
    maps::{PerCpuArray, RingBuf},
    Global,
};
use memtrace_common::loss;

/// Per-event records; userspace sizes it per tool.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

#[map]
pub static LOSSES: PerCpuArray<u64> = PerCpuArray::with_max_entries(loss::NR, 0);

#[inline(always)]
pub fn count_loss(what: u32) {
    if let Some(p) = LOSSES.get_ptr_mut(what) {
        unsafe { *p += 1 };
    }
}

/// errno of a map insert into a full map.
pub const E2BIG: i64 = 7;

/// A new key a map refused, counted by why: the map full (E2BIG), or its
/// entry not allocatable where the event fired (a map without
/// preallocation, whose per-CPU caches a burst of new keys can empty
/// before the kernel refills them).
#[inline(always)]
pub fn count_refused(e: impl Into<i64>) {
    count_loss(match e.into() == -E2BIG {
        true => loss::MAP_FULL,
        false => loss::MAP_BUSY,
    });
}

/// Sends `rec` to userspace, counting it as lost when the buffer is full.
/// The reader is woken at once, even behind batched records: rare records
/// are acted on while their process is still there (its maps are read).
#[inline(always)]
pub fn emit<T: ?Sized>(rec: &T) {
    if EVENTS.output::<T>(rec, BPF_RB_FORCE_WAKEUP as u64).is_err() {
        count_loss(loss::RINGBUF);
    }
}

/// Streamed records wake the reader only once this many bytes wait (set by
/// userspace from the buffer's size); 0 wakes it as the kernel would.
#[unsafe(no_mangle)]
static WAKE_BYTES: Global<u64> = Global::new(0);

/// Wakeup flags for a streamed record. A wakeup is an interrupt (microseconds
/// in a VM) and a reader that keeps up is woken for nearly every record, so
/// they are batched; memtrace also drains on a short timer.
#[inline(always)]
pub fn batched_wakeup() -> u64 {
    let wake = WAKE_BYTES.load();
    if wake == 0 {
        0
    } else if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= wake {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// `emit` for high-rate records, with batched wakeups.
#[inline(always)]
pub fn emit_streamed<T>(rec: &T) {
    if EVENTS.output::<T>(rec, batched_wakeup()).is_err() {
        count_loss(loss::RINGBUF);
    }
}
