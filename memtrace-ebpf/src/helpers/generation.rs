//! Count generations: counting programs put the current generation in
//! their map keys. Userspace flips it and waits out an RCU grace period;
//! from then on no program adds to the old generation's keys, which it
//! reads and deletes without racing an add (a delete racing one loses it).

use aya_ebpf::{macros::map, maps::Array};

#[map]
pub static COUNT_GEN: Array<u32> = Array::with_max_entries(1, 0);

/// The generation (0 or 1) an event is counted in.
#[inline(always)]
pub fn count_gen() -> u32 {
    COUNT_GEN.get(0).copied().unwrap_or(0) & 1
}
