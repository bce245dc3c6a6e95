//! `memcg`: the processes of watched memory cgroups, their RSS counters and
//! the stack of their latest growth (from kmem:rss_stat).

use crate::{rss::NR, TASK_COMM_LEN};

/// A user stack is taken each time a process's RSS has grown this much
/// since the last one: its latest allocations, without a stack per page.
pub const STACK_STEP: u64 = 1 << 20;

/// `MEMCG_WATCH` value of a group without a limit above it.
pub const NO_LINE: u8 = 0xff;

/// Levels a kernel program climbs at most to the group that sets the limit.
pub const MAX_LEVELS: u8 = 8;

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

/// Offsets to read a memory cgroup's usage from its css, from BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemcgOffsets {
    /// `cgroup_subsys_state.parent`.
    pub css_parent: u32,
    /// `mem_cgroup.css`.
    pub memcg_css: u32,
    /// `mem_cgroup.memory` (a `page_counter`).
    pub memcg_memory: u32,
    /// `page_counter.usage`, in pages.
    pub counter_usage: u32,
    /// Non-zero when all were found.
    pub valid: u32,
}

/// The warning line of the group that sets a limit, in pages, and the
/// steps of its run-up (a point each tenth of the limit crossed, where no
/// kernel notifier gives them: cgroup v2).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemcgLine {
    /// u64::MAX: no warning line.
    pub pages: u64,
    /// Set once crossed: reported once.
    pub crossed: u64,
    /// A tenth of the limit, in pages; 0: no steps.
    pub step_pages: u64,
    /// Usage at which the next step is reported.
    pub next_step: u64,
}

/// Sent (as `MEMCG_CROSS`, or `MEMCG_STEP` for a step of the run-up) when
/// an RSS change in a watched group finds the group that sets
/// its limit over the line: the allocation that crossed it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemcgCross {
    pub kind: u32,
    pub pid: u32,
    /// Kernfs id of the group that sets the limit.
    pub limit_id: u64,
    /// Kernfs id of the allocating task's group.
    pub task_id: u64,
    pub usage_pages: u64,
    pub comm: [u8; TASK_COMM_LEN],
}

crate::names! {
    maps {
        MEMCG_WATCH: u64 => u8, OnDemand;
        MEMCG_PROCS: u32 => MemcgProc, OnDemand;
        MEMCG_LINES: u64 => MemcgLine, OnDemand;
    }
    globals {
        MEMCG_CFG: crate::rss::RssConfig;
        MEMCG_OFFS: MemcgOffsets;
    }
    progs {
        MEMCG_RSS = memcg_rss,
        MEMCG_LINE = memcg_line,
    }
}

crate::pod!(MemcgProc, MemcgOffsets, MemcgLine, MemcgCross);
