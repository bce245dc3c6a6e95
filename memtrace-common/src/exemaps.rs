//! Executable mappings learned in the kernel as they are made (an exec's
//! image, each executable mmap of a file), so that a process's stacks
//! symbolize even when it is gone before its /proc maps could be read.

use crate::snoop::FdFileOffsets;

/// Longest path or name kept from the kernel, with its NUL.
pub const NAME_LEN: usize = 256;

/// A traced process's new executable mapping (`kind::PROC_MAP`) or, at
/// exec, its new image's code (`kind::PROC_IMAGE`: `start`..`start + len`
/// is the binary's `mm->start_code..end_code`, `pgoff` 0, `name` the path
/// given to exec).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExeMap {
    pub kind: u32,
    pub pid: u32,
    pub start: u64,
    pub len: u64,
    /// File offset of `start`, in bytes (mmap's offset argument).
    pub pgoff: u64,
    /// The file's superblock device, kernel dev_t (major << 20 | minor).
    pub dev: u32,
    pub _pad: u32,
    pub ino: u64,
    /// PROC_MAP: the file's name (its dentry's, no directory); PROC_IMAGE:
    /// the path exec was given. NUL-terminated, empty when unreadable.
    pub name: [u8; NAME_LEN],
}

/// An executable mmap between its sys_enter and sys_exit, by thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ExeMapPending {
    pub len: u64,
    pub pgoff: u64,
    /// `struct file *` behind the fd at entry: its name is read at exit.
    pub file: u64,
    pub ino: u64,
    pub dev: u32,
    pub _pad: u32,
}

/// `EXEMAPS_CFG` global: tracepoint field offsets and the BTF offsets the
/// programs read through. `valid` 0 leaves the programs idle.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ExeMapsConfig {
    /// `sys_enter_mmap`: len, prot, flags, fd, off.
    pub mmap: [u32; 5],
    /// `sys_exit_mmap`: ret.
    pub mmap_ret: u32,
    /// `sched_process_exec`: the `__data_loc` filename.
    pub exec_filename: u32,
    /// `task_struct.mm`, `mm_struct.exe_file`, `start_code`, `end_code`.
    pub task_mm: u32,
    pub mm_exe_file: u32,
    pub mm_start_code: u32,
    pub mm_end_code: u32,
    /// `file.f_path.dentry` and `dentry.d_name.name`, each summed.
    pub file_dentry: u32,
    pub dentry_name: u32,
    pub file: FdFileOffsets,
    pub valid: u32,
}

crate::names! {
    maps {
        EXEMAP_PENDING: u32 => ExeMapPending, OnDemand;
    }
    globals {
        EXEMAPS_CFG: ExeMapsConfig;
    }
    progs {
        EXEMAP_ENTER = exemap_enter,
        EXEMAP_EXIT = exemap_exit,
        EXEMAP_EXEC = exemap_exec,
    }
}

crate::pod!(ExeMapsConfig, ExeMapPending, ExeMap);
