//! `ffaults`: file-backed page faults by file.

use crate::TASK_COMM_LEN;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FfaultsConfig {
    /// `filemap:mm_filemap_fault` field offsets.
    pub tp_ino: u32,
    pub tp_dev: u32,
    /// BTF offsets for the kprobe/fentry fallback on `filemap_fault(struct vm_fault *)`.
    pub vmf_vma: u32,
    pub vma_file: u32,
    pub file_inode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub tgid: u32,
    /// Kernel `dev_t` (major << 20 | minor).
    pub dev: u32,
    pub ino: u64,
    /// The count generation (see `Generational`); 0 outside the count map.
    pub gen: u32,
    pub _pad: u32,
}

/// Sent once per new (process, file) so userspace can name the file while the
/// process is alive.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FileSeen {
    pub kind: u32,
    pub _pad: u32,
    pub key: FileKey,
    pub comm: [u8; TASK_COMM_LEN],
}

crate::names! {
    maps {
        FILE_FAULTS: FileKey => u64, OnDemand;
        FILES_SEEN: FileKey => u8, OnDemand;
    }
    globals {
        FFAULT_CFG: FfaultsConfig;
    }
    progs {
        FFAULTS_TP = ffaults_tp,
        FFAULTS_KPROBE = ffaults_kprobe,
        FFAULTS_FENTRY = ffaults_fentry,
    }
}

crate::pod!(FileKey, FfaultsConfig, FileSeen);
