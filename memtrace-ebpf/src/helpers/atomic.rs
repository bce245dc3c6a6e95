//! An atomic add, for values several CPUs write: core's atomic types have
//! no read-modify-write on the BPF target, and an add whose result is
//! unused is the one every BPF target has (5.10's too).

use core::intrinsics::{atomic_xadd, AtomicOrdering};

#[inline(always)]
pub fn atomic_add(at: *mut u64, v: u64) {
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(at, v) };
}
