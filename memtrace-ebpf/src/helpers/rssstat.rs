//! Decoding one kmem:rss_stat record, for the tools that follow RSS.

use aya_ebpf::programs::TracePointContext;
use memtrace_common::{
    loss,
    rss::{RssConfig, NR},
};

use super::emit::count_loss;

/// The slot (`rss::FILE`...) of the counter a record changed and its new
/// value in bytes; None for counters memtrace does not keep, and for a
/// failed read (counted).
#[inline(always)]
pub fn rss_change(ctx: &TracePointContext, c: &RssConfig) -> Option<(usize, i64)> {
    let (Ok(member), Ok(size)) = (unsafe {
        (
            ctx.read_at::<i32>(c.tp_member as usize),
            ctx.read_at::<i64>(c.tp_size as usize),
        )
    }) else {
        count_loss(loss::READ);
        return None;
    };
    // The kernel's counter index to memtrace's slot (from BTF, set by
    // userspace); a negative or unknown member maps to NR and is dropped.
    // One unsigned check on the value used as the index: with two checks
    // LLVM indexed with an unchecked copy.
    let member = member as u32;
    let slot = if member < 8 {
        c.slots[member as usize] as usize
    } else {
        NR
    };
    let slot = core::hint::black_box(slot);
    if slot >= NR {
        return None;
    }
    Some((slot, size))
}
