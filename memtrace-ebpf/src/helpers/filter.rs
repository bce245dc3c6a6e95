//! Which processes are traced: one pid, optionally with its descendants.

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::map, maps::HashMap, Global};
use memtrace_common::Filter;

use super::NO_PREALLOC;

#[unsafe(no_mangle)]
pub static FILTER: Global<Filter> = Global::new(Filter {
    tgid: 0,
    children: 0,
    stacks: 0,
    fork_child_pid: 0,
    myself: 0,
});

/// Processes forked from the traced one (`--children`).
#[map]
pub static FOLLOWED: HashMap<u32, u8> = HashMap::with_max_entries(8192, NO_PREALLOC);

#[inline(always)]
pub fn current_tgid() -> u32 {
    (bpf_get_current_pid_tgid() >> 32) as u32
}

/// Whether events of process `tgid` are wanted.
#[inline(always)]
pub fn wanted(tgid: u32) -> bool {
    let f = FILTER.load();
    if f.tgid == 0 {
        return tgid != f.myself;
    }
    if f.tgid == tgid {
        return true;
    }
    f.children != 0 && unsafe { FOLLOWED.get(tgid) }.is_some()
}
