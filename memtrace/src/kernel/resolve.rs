//! Offsets resolved as a set: a member or enumerator this kernel's BTF
//! lacks is remembered and named, never turned into a read at offset 0.

use memtrace_common::{
    kunwind::VmaOffsets,
    snoop::FdFileOffsets,
    stacks::{ImageOffsets, MAX_IMAGE_LEVELS},
    TaskOffsets,
};

use super::btf::{page_size, KernelBtf};
use crate::error::Error;

impl KernelBtf {
    /// A resolver that remembers every member it could not find.
    pub fn resolver(&self) -> Resolve<'_> {
        Resolve {
            btf: self,
            missing: Vec::new(),
        }
    }

    /// The task, mm and cgroup offsets every tool reads through; an error
    /// naming each member this kernel's BTF lacks.
    pub fn task_offsets(&self) -> Result<TaskOffsets, Error> {
        let mut r = self.resolver();
        let (rss_stride, rss_count) = match self.rss_layout() {
            Some(l) => l,
            None => {
                r.missing.push("mm_struct.rss_stat (layout)".into());
                (0, 0)
            }
        };
        let t = TaskOffsets {
            pid: r.member("task_struct", "pid"),
            tgid: r.member("task_struct", "tgid"),
            comm: r.member("task_struct", "comm"),
            mm: r.member("task_struct", "mm"),
            cgroups: r.member("task_struct", "cgroups"),
            css_set_subsys: r.member("css_set", "subsys"),
            memory_cgrp_id: r.enumerator("cgroup_subsys_id", "memory_cgrp_id"),
            css_cgroup: r.member("cgroup_subsys_state", "cgroup"),
            cgroup_kn: r.member("cgroup", "kn"),
            kernfs_node_id: r.member("kernfs_node", "id"),
            mm_rss_stat: r.member("mm_struct", "rss_stat"),
            mm_total_vm: r.member("mm_struct", "total_vm"),
            mm_brk: r.member("mm_struct", "brk"),
            rss_stride,
            rss_count,
            task_cred: r.member("task_struct", "cred"),
            cred_uid: r.member("cred", "uid"),
            task_signal: r.member("task_struct", "signal"),
            signal_oom_score_adj: r.member("signal_struct", "oom_score_adj"),
            page_kb: (page_size() / 1024) as u32,
            valid: 1,
        };
        r.done("the task and mm offsets", t)
    }

    /// What the in-kernel unwinder reads of the mapping `bpf_find_vma`
    /// finds (the helper is there from 5.17).
    pub fn vma_offsets(&self) -> Result<VmaOffsets, Error> {
        if !self.has_func("bpf_find_vma") {
            return Err(Error::NoBtf(
                "this kernel has no bpf_find_vma (5.17+)".into(),
            ));
        }
        let mut r = self.resolver();
        let o = VmaOffsets {
            vm_start: r.member("vm_area_struct", "vm_start"),
            vm_pgoff: r.member("vm_area_struct", "vm_pgoff"),
            vm_file: r.member("vm_area_struct", "vm_file"),
            file_inode: r.member("file", "f_inode"),
            inode_ino: r.member("inode", "i_ino"),
            inode_sb: r.member("inode", "i_sb"),
            sb_dev: r.member("super_block", "s_dev"),
            page_shift: page_size().trailing_zeros(),
            valid: 1,
        };
        r.done("the mapping offsets", o)
    }

    /// What tells a process's image (executable file, mappings' base, name)
    /// and its ancestors, for counts keyed by image.
    pub fn image_offsets(&self) -> Result<ImageOffsets, Error> {
        let mut r = self.resolver();
        let o = ImageOffsets {
            task_group_leader: r.member("task_struct", "group_leader"),
            task_real_parent: r.member("task_struct", "real_parent"),
            task_tgid: r.member("task_struct", "tgid"),
            task_comm: r.member("task_struct", "comm"),
            task_mm: r.member("task_struct", "mm"),
            mm_exe_file: r.member("mm_struct", "exe_file"),
            mm_mmap_base: r.member("mm_struct", "mmap_base"),
            levels: MAX_IMAGE_LEVELS,
        };
        r.done("the image offsets", o)
    }

    /// The offsets from a task's fd to its file's device and inode.
    pub fn fd_file_offsets(&self) -> Result<FdFileOffsets, Error> {
        let mut r = self.resolver();
        let o = FdFileOffsets {
            task_files: r.member("task_struct", "files"),
            files_fdt: r.member("files_struct", "fdt"),
            fdt_max_fds: r.member("fdtable", "max_fds"),
            fdt_fd: r.member("fdtable", "fd"),
            file_inode: r.member("file", "f_inode"),
            inode_ino: r.member("inode", "i_ino"),
            inode_sb: r.member("inode", "i_sb"),
            sb_dev: r.member("super_block", "s_dev"),
            valid: 1,
        };
        r.done("the fd-to-file offsets", o)
    }
}

/// Struct members and enum values looked up in kernel BTF, with every miss
/// remembered: `done` gives the value only when nothing was missing, so a
/// member that is not there never becomes a read at offset 0.
pub struct Resolve<'a> {
    pub(super) btf: &'a KernelBtf,
    pub(super) missing: Vec<String>,
}

impl Resolve<'_> {
    pub fn member(&mut self, s: &str, m: &str) -> u32 {
        self.btf.offset(s, m).unwrap_or_else(|| {
            self.missing.push(format!("{s}.{m}"));
            0
        })
    }

    /// Enumerator `n` of enum `e` (of any enum when `e` is empty).
    pub fn enumerator(&mut self, e: &str, n: &str) -> u32 {
        self.btf.enumerator(e, n).unwrap_or_else(|| {
            self.missing
                .push(format!("enum {e} {n}").replace("enum  ", "enumerator "));
            0
        })
    }

    /// `v` when every lookup succeeded, else an error naming what `what`
    /// needs and this kernel lacks.
    pub fn done<T>(self, what: &str, v: T) -> Result<T, Error> {
        if self.missing.is_empty() {
            Ok(v)
        } else {
            Err(Error::MissingOffsets {
                what: what.to_string(),
                missing: self.missing.join(", "),
            })
        }
    }
}
