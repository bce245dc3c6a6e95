//! `faults`: page faults counted in the kernel.

use crate::TASK_COMM_LEN;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FaultConfig {
    /// Key by faulting page (for `--by-mapping`).
    pub by_page: u32,
    /// `exceptions:page_fault_*` field offsets.
    pub tp_address: u32,
    pub tp_error_code: u32,
    /// Slots in `FAULT_SLOTS` minus one (a power of two minus one); 0: the
    /// slots are not used (stacks, pages or a perf-event attach).
    pub slot_mask: u32,
    /// Non-zero: a new count takes the faulting task's memory cgroup
    /// (`top`, `serve`), read through TASK's offsets.
    pub memcg: u32,
    /// By stack: slots in `FAULT_SLOTS` minus one where a fault the full
    /// count map could not take is counted by process (0: none; then it
    /// is counted in `FAULT_SPILL` only).
    pub spill_mask: u32,
}

/// One process's fault counts on one CPU, in the direct-mapped slot
/// `tgid & slot_mask` of a per-CPU array: the default count-by-process
/// view takes an inlined array lookup per fault instead of a hash lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FaultSlot {
    /// 0: free.
    pub tgid: u32,
    pub _pad: u32,
    /// Faults taken in user mode, in kernel mode.
    pub count: [u64; 2],
    pub comm: [u8; TASK_COMM_LEN],
}

/// `FaultKey::kernel_mode`'s bit for counts of forked processes.
pub const FORKED: u8 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FaultKey {
    pub tgid: u32,
    /// 0: the fault was taken in user mode, 1: in kernel mode; `FORKED`
    /// added: counted by processes forked from `tgid`'s image (see
    /// `stacks::StackKey::forked`).
    pub kernel_mode: u8,
    /// The count generation (see `Generational`).
    pub gen: u8,
    /// 16 more bits of a walked user stack's hash (see `StackKey`): the key
    /// stays 24 bytes, which every fault hashes.
    pub ustack_check: u16,
    pub ustack: i32,
    pub kstack: i32,
    /// Page-aligned fault address when keyed by page, else 0.
    pub page: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FaultVal {
    pub count: u64,
    /// Kernfs id of the task's memory cgroup when the count began (0: not
    /// taken), so a process gone before memtrace reads it keeps its group.
    pub memcg_id: u64,
    pub comm: [u8; TASK_COMM_LEN],
    /// The process that counted here last on this CPU (see
    /// `stacks::StackMember`).
    pub last: u32,
    pub _pad: u32,
}

crate::names! {
    maps {
        FAULTS: FaultKey => FaultVal, OnDemand;
        FAULTS_PERF: FaultKey => FaultVal, OnDemand;
        FAULT_SLOTS: u32 => FaultSlot, OnDemand;
        FAULT_SLOT_FREE: u32 => u32, OnDemand;
        FAULT_SPILL: u32 => u64, Compiled;
    }
    globals {
        FAULT_CFG: FaultConfig;
    }
    progs {
        FAULTS_USER_BTF = faults_user_btf,
        FAULTS_KERNEL_BTF = faults_kernel_btf,
        FAULTS_RAW = faults_raw,
        FAULTS_USER_TP = faults_user_tp,
        FAULTS_KERNEL_TP = faults_kernel_tp,
        FAULTS_PERF_PROG = faults_perf,
    }
}

crate::pod!(FaultConfig, FaultKey, FaultVal, FaultSlot);
