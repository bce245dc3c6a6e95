//! Stack-keyed counters shared by the stack-counting tools (brkstack).

use crate::TASK_COMM_LEN;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BrkConfig {
    /// `syscalls:sys_enter_brk` offset of `brk`.
    pub tp_brk: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StackKey {
    pub tgid: u32,
    pub ustack: i32,
    pub kstack: i32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct StackVal {
    pub count: u64,
    /// Bytes the heap grew by (brk).
    pub bytes: u64,
    pub comm: [u8; TASK_COMM_LEN],
}
