//! `top` and `serve`: mmap calls counted per process in the kernel (the
//! other figures come from the faults, brkstack, ffaults, reclaim, rss and
//! oomkill programs, loaded in the same session).

use crate::TASK_COMM_LEN;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TopConfig {
    /// `syscalls:sys_enter_mmap` offset of `len`.
    pub tp_mmap_len: u32,
    pub _pad: u32,
}

/// mmap calls of one process on one CPU, and the bytes they asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MmapCount {
    pub calls: u64,
    pub bytes: u64,
    pub comm: [u8; TASK_COMM_LEN],
}

crate::names! {
    maps {
        MMAP_COUNTS: crate::ProcKey => MmapCount, OnDemand;
    }
    globals {
        TOP_CFG: TopConfig;
    }
    progs {
        TOP_MMAP = top_mmap,
    }
}

crate::pod!(TopConfig, MmapCount);
