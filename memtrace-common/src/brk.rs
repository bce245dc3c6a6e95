//! `brkstack`: brk calls counted by (process, user stack) in `stacks`'
//! keys and values.

use crate::stacks::{StackKey, StackVal};

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BrkConfig {
    /// `syscalls:sys_enter_brk` offset of `brk`.
    pub tp_brk: u32,
    pub _pad: u32,
}

crate::names! {
    maps {
        BRK_STACKS: StackKey => StackVal, OnDemand;
    }
    globals {
        BRK_CFG: BrkConfig;
    }
    progs {
        BRK_ENTER = brk_enter,
    }
}

crate::pod!(BrkConfig);
