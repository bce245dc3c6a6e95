//! `rss`: a process's RSS counters as the kernel changes them (kmem:rss_stat).

use crate::TASK_COMM_LEN;

/// memtrace's slots for the mm counters; the kernel's own indexes
/// (`MM_FILEPAGES`...) come from BTF and map onto these (`RssConfig.slots`).
pub const FILE: usize = 0;
pub const ANON: usize = 1;
pub const SWAP: usize = 2;
pub const SHMEM: usize = 3;
pub const NR: usize = 4;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RssConfig {
    pub tp_mm_id: u32,
    pub tp_curr: u32,
    pub tp_member: u32,
    pub tp_size: u32,
    /// Bytes; 0: no threshold.
    pub threshold: u64,
    /// The slot (`FILE`...) of each kernel counter index `member`; `NR` for
    /// counters memtrace does not keep.
    pub slots: [u8; 8],
}

/// What tells `rss_exit` that a process's last thread is leaving: its own
/// global, as memcg's programs load `RssConfig` whole onto a stack that
/// has no room for more on kernels before about 6.13.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RssExitConfig {
    /// `group_dead` of sched:sched_process_exit; 0 where the format has no
    /// such field (before 6.16): then `signal->live` tells, at these offsets.
    pub tp_group_dead: u32,
    pub task_signal: u32,
    pub signal_live: u32,
    pub _pad: u32,
}

impl RssConfig {
    /// The value before userspace sets it (a `static` needs a const).
    pub const INIT: RssConfig = RssConfig {
        tp_mm_id: 0,
        tp_curr: 0,
        tp_member: 0,
        tp_size: 0,
        threshold: 0,
        slots: [NR as u8; 8],
    };
}

/// Latest counters of one process, in bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RssVal {
    pub bytes: [i64; NR],
    /// Peak of file + anon + shmem, in bytes.
    pub peak: u64,
    /// Set once the threshold was crossed (the event is sent once).
    pub crossed: u32,
    /// The counters the kernel has written (bit `1 << slot`): memtrace
    /// fills the others from /proc for a process it did not see start.
    pub set: u32,
    pub comm: [u8; TASK_COMM_LEN],
    /// Its last thread exited: later changes (its mm torn down by another
    /// task) are not its, and the exit row is printed from what is here
    /// when the exit record was lost.
    pub exited: u32,
    pub _pad: u32,
}

/// Sent when a followed process's last thread exits: its row's last
/// figures, so that every process gets its exit row however short it lived.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RssExit {
    pub kind: u32,
    pub pid: u32,
    pub bytes: [i64; NR],
    pub peak: u64,
    pub comm: [u8; TASK_COMM_LEN],
}

/// Sent when a process's RSS (less its excluded mappings) crosses the threshold.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RssCross {
    pub kind: u32,
    pub pid: u32,
    /// The task whose counter change crossed it (may be another process, e.g. reclaim).
    pub task_pid: u32,
    pub task_tid: u32,
    pub bytes: [i64; NR],
    pub excluded: u64,
    pub ustack: i32,
    pub kstack: i32,
    pub comm: [u8; TASK_COMM_LEN],
    pub task_comm: [u8; TASK_COMM_LEN],
}

crate::names! {
    maps {
        RSS: u32 => RssVal, OnDemand;
        RSS_OWNER: u32 => u32, OnDemand;
        RSS_EXCLUDED: u32 => u64, OnDemand;
    }
    globals {
        RSS_CFG: RssConfig;
        RSS_EXIT_CFG: RssExitConfig;
    }
    progs {
        RSS_STAT = rss_stat,
        RSS_EXIT = rss_exit,
    }
}

crate::pod!(RssConfig, RssExitConfig, RssVal, RssCross, RssExit);
