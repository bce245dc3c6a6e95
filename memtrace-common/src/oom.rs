//! `oomkill`: one record per OOM kill.

use crate::TASK_COMM_LEN;

/// Field offsets of the `oom:mark_victim` tracepoint, from its format file.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OomTpOffsets {
    pub pid: u32,
    /// `__data_loc char[] comm`.
    pub comm: u32,
    pub total_vm: u32,
    pub anon_rss: u32,
    pub file_rss: u32,
    pub shmem_rss: u32,
    pub uid: u32,
    pub oom_score_adj: u32,
    /// Non-zero when the tracepoint has the RSS fields (kernels >= 5.19).
    pub has_rss: u32,
}

/// Offsets into `struct oom_control`, from BTF, for kprobe/fentry on `oom_kill_process`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OomKprobeOffsets {
    pub totalpages: u32,
    pub chosen: u32,
    pub memcg: u32,
    /// `struct mem_cgroup` -> `css` (a `cgroup_subsys_state`).
    pub memcg_css: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OomEvent {
    pub kind: u32,
    /// `method::*` the record was produced under.
    pub method: u32,
    pub trigger_pid: u32,
    pub trigger_tid: u32,
    pub victim_pid: u32,
    pub victim_tid: u32,
    pub uid: u32,
    pub oom_score_adj: i32,
    pub total_vm_kb: u64,
    pub anon_rss_kb: u64,
    pub file_rss_kb: u64,
    pub shmem_rss_kb: u64,
    /// `oom_control.totalpages`; 0 when the attach method cannot see it.
    pub totalpages: u64,
    /// Kernfs id (the inode number of the cgroup directory) of the victim's memcg.
    pub memcg_id: u64,
    /// 1 when `memcg_id` is the OOM's own memcg (from `oom_control`), 2 the
    /// victim's memory cgroup, 3 the triggering task's.
    pub memcg_source: u32,
    pub ustack: i32,
    pub kstack: i32,
    pub _pad: u32,
    pub trigger_comm: [u8; TASK_COMM_LEN],
    pub victim_comm: [u8; TASK_COMM_LEN],
}

crate::names! {
    maps {
        OOM_SCRATCH: () => (), Compiled;
    }
    globals {
        OOM_TP: OomTpOffsets;
        OOM_CONTROL: OomKprobeOffsets;
        OOM_STACKS: u32;
    }
    progs {
        OOM_KPROBE = oom_kprobe,
        OOM_FENTRY = oom_fentry,
        OOM_RAW_TP = oom_raw_tp,
        OOM_TP_BTF = oom_tp_btf,
        OOM_TRACEPOINT = oom_tracepoint,
    }
}

crate::pod!(OomTpOffsets, OomKprobeOffsets, OomEvent);
