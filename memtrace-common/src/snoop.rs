//! `mmapsnoop` and `shmsnoop`: one record per system call, with the
//! arguments taken at sys_enter and the return value at sys_exit.

use crate::TASK_COMM_LEN;

/// The most arguments any traced call has (mmap).
pub const MAX_ARGS: usize = 6;

/// Which call a record is for.
pub mod op {
    pub const MMAP: u32 = 1;
    pub const MUNMAP: u32 = 2;
    pub const MREMAP: u32 = 3;
    pub const BRK: u32 = 4;
    pub const SHMGET: u32 = 5;
    pub const SHMAT: u32 = 6;
    pub const SHMDT: u32 = 7;
    pub const SHMCTL: u32 = 8;
}

/// A call between its sys_enter and sys_exit, by thread (`SNOOP_PENDING`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PendingCall {
    pub op: u32,
    pub _pad: u32,
    /// Raw syscall arguments in the order of the tracepoint's fields.
    pub args: [u64; MAX_ARGS],
}

/// One completed call (`kind::MMAP_CALL` or `kind::SHM_CALL`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SyscallEvent {
    pub kind: u32,
    pub op: u32,
    pub pid: u32,
    pub tid: u32,
    /// The syscall's return value: an address, a count, or -errno.
    pub ret: i64,
    pub args: [u64; MAX_ARGS],
    pub ustack: i32,
    pub kstack: i32,
    /// File behind the call's fd (mmap), read in the kernel so userspace can
    /// check the name it finds: kernel dev_t (major << 20 | minor), inode; 0 if none.
    pub file_dev: u32,
    pub _pad: u32,
    pub file_ino: u64,
    pub comm: [u8; TASK_COMM_LEN],
}

/// BTF offsets to go from the current task and an fd to the file's device
/// and inode: task->files->fdt->fd[fd]->f_inode->{i_ino, i_sb->s_dev}.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FdFileOffsets {
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdt_max_fds: u32,
    pub fdt_fd: u32,
    pub file_inode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    /// Non-zero when every offset above was found.
    pub valid: u32,
}

impl FdFileOffsets {
    /// Not resolved (yet): the kernel programs' initial value.
    pub const NONE: FdFileOffsets = FdFileOffsets {
        task_files: 0,
        files_fdt: 0,
        fdt_max_fds: 0,
        fdt_fd: 0,
        file_inode: 0,
        inode_ino: 0,
        inode_sb: 0,
        sb_dev: 0,
        valid: 0,
    };
}

/// `MMAP_SNOOP` global: tracepoint field offsets from the tracefs format
/// files, in argument order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MmapSnoopConfig {
    /// `sys_enter_mmap`: addr, len, prot, flags, fd, off.
    pub mmap: [u32; 6],
    /// `sys_enter_munmap`: addr, len.
    pub munmap: [u32; 2],
    /// `sys_enter_mremap`: addr, old_len, new_len, flags, new_addr.
    pub mremap: [u32; 5],
    /// `sys_enter_brk`: brk.
    pub brk: u32,
    /// `ret` of each `sys_exit_*`.
    pub mmap_ret: u32,
    pub munmap_ret: u32,
    pub mremap_ret: u32,
    pub brk_ret: u32,
    /// Non-zero: send failed calls only (`-x`).
    pub failed_only: u32,
    /// memtrace's own pid: its calls are not traced (they would feed back).
    pub self_tgid: u32,
    pub file: FdFileOffsets,
}

/// `SHM_SNOOP` global, as `MmapSnoopConfig`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ShmSnoopConfig {
    /// `sys_enter_shmget`: key, size, shmflg.
    pub shmget: [u32; 3],
    /// `sys_enter_shmat`: shmid, shmaddr, shmflg.
    pub shmat: [u32; 3],
    /// `sys_enter_shmdt`: shmaddr.
    pub shmdt: u32,
    /// `sys_enter_shmctl`: shmid, cmd, buf.
    pub shmctl: [u32; 3],
    pub shmget_ret: u32,
    pub shmat_ret: u32,
    pub shmdt_ret: u32,
    pub shmctl_ret: u32,
    pub failed_only: u32,
    pub self_tgid: u32,
}

/// Whether a call failed. brk reports failure by returning the old break
/// instead of the one asked for (brk(0) only asks).
#[inline(always)]
pub fn failed(op: u32, first_arg: u64, ret: i64) -> bool {
    if op == op::BRK {
        first_arg != 0 && ret as u64 != first_arg
    } else {
        // -errno, as the kernel's IS_ERR_VALUE (MAX_ERRNO 4095).
        (-4095..0).contains(&ret)
    }
}

crate::names! {
    maps {
        SNOOP_PENDING: u32 => PendingCall, OnDemand;
    }
    globals {
        MMAP_SNOOP: MmapSnoopConfig;
        SHM_SNOOP: ShmSnoopConfig;
    }
    progs {
        MMAP_ENTER = mmap_enter,
        MMAP_EXIT = mmap_exit,
        MUNMAP_ENTER = munmap_enter,
        MUNMAP_EXIT = munmap_exit,
        MREMAP_ENTER = mremap_enter,
        MREMAP_EXIT = mremap_exit,
        SNOOP_BRK_ENTER = snoop_brk_enter,
        SNOOP_BRK_EXIT = snoop_brk_exit,
        SHMGET_ENTER = shmget_enter,
        SHMGET_EXIT = shmget_exit,
        SHMAT_ENTER = shmat_enter,
        SHMAT_EXIT = shmat_exit,
        SHMDT_ENTER = shmdt_enter,
        SHMDT_EXIT = shmdt_exit,
        SHMCTL_ENTER = shmctl_enter,
        SHMCTL_EXIT = shmctl_exit,
    }
}

crate::pod!(
    MmapSnoopConfig,
    ShmSnoopConfig,
    FdFileOffsets,
    SyscallEvent,
    PendingCall
);
