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
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FaultKey {
    pub tgid: u32,
    /// 0: the fault was taken in user mode, 1: in kernel mode.
    pub kernel_mode: u16,
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
    pub comm: [u8; TASK_COMM_LEN],
}
