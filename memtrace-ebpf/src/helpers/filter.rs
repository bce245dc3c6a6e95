//! Which processes are traced: one pid, optionally with its descendants;
//! or the ones in the memory cgroups memcg watches.

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::map, maps::HashMap, Global};
use memtrace_common::Filter;

use super::{
    reads::{current_task, memcg_id},
    NO_PREALLOC,
};

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

/// Memory cgroups memcg watches, by kernfs id (descendants included, set by
/// userspace): how many levels up the group that sets their limit is.
#[map]
pub static MEMCG_WATCH: HashMap<u64, u8> = HashMap::with_max_entries(1024, NO_PREALLOC);

/// Whether the current task is in a watched memory cgroup (and not memtrace).
/// A function of its own: inlined, its reads took stack in the allocator
/// programs, whose frame the in-kernel unwinder's calls add to (6.1 and 6.12
/// refused the sum, 544 bytes of 512).
#[inline(never)]
pub fn in_watched_group() -> bool {
    if current_tgid() == FILTER.load().myself {
        return false;
    }
    let id = unsafe { memcg_id(current_task()) };
    id != 0 && unsafe { MEMCG_WATCH.get(&id) }.is_some()
}
