//! `memcg`: the processes of watched memory cgroups, their RSS counters and
//! the stack of their latest growth (from kmem:rss_stat).

use crate::{rss::NR, TASK_COMM_LEN};

/// A user stack is taken each time a process's RSS has grown this much
/// since the last one: its latest allocations, without a stack per page.
pub const STACK_STEP: u64 = 1 << 20;

/// One process in a watched group.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemcgProc {
    /// RSS counters in bytes, by `rss::FILE`... slot.
    pub bytes: [i64; NR],
    /// RSS (file + anon + shmem) when the last stack was taken.
    pub stack_at: u64,
    /// Kernfs id of the process's memory cgroup at its latest change.
    pub memcg_id: u64,
    pub ustack: i32,
    pub kstack: i32,
    pub comm: [u8; TASK_COMM_LEN],
}
