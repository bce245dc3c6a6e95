//! Kernel struct offsets from BTF. Rust BPF code has no CO-RE relocations,
//! so userspace resolves offsets here and passes them to the programs.

use btf_rs::{Btf, Type};
use memtrace_common::TaskOffsets;

use crate::error::Error;

pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

pub struct KernelBtf {
    btf: Btf,
}

impl KernelBtf {
    pub fn load() -> Result<Self, Error> {
        Btf::from_file(VMLINUX)
            .map(|btf| KernelBtf { btf })
            .map_err(|e| Error::NoBtf(format!("{VMLINUX}: {e}")))
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, Error> {
        Btf::from_bytes(bytes)
            .map(|btf| KernelBtf { btf })
            .map_err(|e| Error::NoBtf(e.to_string()))
    }

    fn named_struct(&self, name: &str) -> Option<btf_rs::Struct> {
        self.btf
            .resolve_types_by_name(name)
            .ok()?
            .into_iter()
            .find_map(|t| match t {
                Type::Struct(s) if !s.members.is_empty() => Some(s),
                _ => None,
            })
    }

    /// Byte offset of `member` in `struct name`, looking through anonymous
    /// structs and unions.
    pub fn offset(&self, name: &str, member: &str) -> Option<u32> {
        let s = self.named_struct(name)?;
        self.find_member(&s, member).map(|bits| bits / 8)
    }

    fn find_member(&self, s: &btf_rs::Struct, member: &str) -> Option<u32> {
        self.find(s, member).map(|(bits, _)| bits)
    }

    /// Bit offset and type of `member`, looking through anonymous members.
    fn find(&self, s: &btf_rs::Struct, member: &str) -> Option<(u32, Type)> {
        for m in &s.members {
            let mname = self.btf.resolve_name(m).unwrap_or_default();
            if mname == member {
                return Some((m.bit_offset(), self.btf.resolve_chained_type(m).ok()?));
            }
            if mname.is_empty() {
                if let Ok(Type::Struct(inner) | Type::Union(inner)) =
                    self.btf.resolve_chained_type(m)
                {
                    if let Some((off, t)) = self.find(&inner, member) {
                        return Some((m.bit_offset() + off, t));
                    }
                }
            }
        }
        None
    }

    /// (stride, offset of the count) of the RSS counters in `mm->rss_stat`:
    /// an array of `struct percpu_counter` since 6.2, before it a
    /// `struct mm_rss_stat` holding `atomic_long_t count[]`.
    fn rss_layout(&self) -> Option<(u32, u32)> {
        let mm = self.named_struct("mm_struct")?;
        match self.find(&mm, "rss_stat")?.1 {
            Type::Array(_) => Some((
                self.size("percpu_counter")?,
                self.offset("percpu_counter", "count")?,
            )),
            Type::Struct(s) => Some((8, self.find_member(&s, "count")? / 8)),
            _ => None,
        }
    }

    pub fn size(&self, name: &str) -> Option<u32> {
        self.named_struct(name).map(|s| s.size() as u32)
    }

    /// Looks `name` up among the members of every enum named `enum_name`.
    pub fn enumerator(&self, enum_name: &str, name: &str) -> Option<u32> {
        for t in self.btf.resolve_types_by_name(enum_name).ok()? {
            if let Type::Enum(e) = t {
                for m in &e.members {
                    if self.btf.resolve_name(m).ok()? == name {
                        return Some(m.val());
                    }
                }
            }
        }
        None
    }

    /// Whether the kernel has a function `name` (a kprobe/fentry target).
    pub fn has_func(&self, name: &str) -> bool {
        self.btf
            .resolve_types_by_name(name)
            .map(|ts| ts.iter().any(|t| matches!(t, Type::Func(_))))
            .unwrap_or(false)
    }

    /// Whether tp_btf can attach to tracepoint `name` (its `btf_trace_` typedef exists).
    pub fn has_btf_tracepoint(&self, name: &str) -> bool {
        self.btf
            .resolve_types_by_name(&format!("btf_trace_{name}"))
            .map(|ts| !ts.is_empty())
            .unwrap_or(false)
    }

    /// The task, mm and cgroup offsets every tool reads through.
    pub fn task_offsets(&self) -> TaskOffsets {
        let page_kb = (page_size() / 1024) as u32;
        let get = |s: &str, m: &str| self.offset(s, m);
        let r = (|| {
            let rss = self.rss_layout()?;
            Some(TaskOffsets {
                pid: get("task_struct", "pid")?,
                tgid: get("task_struct", "tgid")?,
                comm: get("task_struct", "comm")?,
                mm: get("task_struct", "mm")?,
                cgroups: get("task_struct", "cgroups")?,
                css_set_subsys: get("css_set", "subsys")?,
                memory_cgrp_id: self.enumerator("cgroup_subsys_id", "memory_cgrp_id")?,
                css_cgroup: get("cgroup_subsys_state", "cgroup")?,
                cgroup_kn: get("cgroup", "kn")?,
                kernfs_node_id: get("kernfs_node", "id")?,
                mm_rss_stat: get("mm_struct", "rss_stat")?,
                mm_total_vm: get("mm_struct", "total_vm")?,
                mm_brk: get("mm_struct", "brk")?,
                rss_stride: rss.0,
                rss_count: rss.1,
                task_cred: get("task_struct", "cred")?,
                cred_uid: get("cred", "uid")?,
                task_signal: get("task_struct", "signal")?,
                signal_oom_score_adj: get("signal_struct", "oom_score_adj")?,
                page_kb,
                valid: 1,
            })
        })();
        r.unwrap_or(TaskOffsets {
            page_kb,
            ..Default::default()
        })
    }
}

pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as u64
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved() -> KernelBtf {
        // vmlinux BTF saved from this project's 6.18 kernel (gzip).
        let gz = include_bytes!("../../tests/data/vmlinux-6.18.btf.gz");
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
        KernelBtf::from_bytes(&raw).unwrap()
    }

    #[test]
    fn task_struct_offsets_match_the_hand_checked_ones() {
        // Figures from shared/kernel-notes.md, read by hand with pahole-like tools.
        let b = saved();
        assert_eq!(b.offset("task_struct", "pid"), Some(1264));
        assert_eq!(b.offset("task_struct", "tgid"), Some(1268));
        assert_eq!(b.offset("task_struct", "comm"), Some(1752));
        assert_eq!(b.offset("oom_control", "totalpages"), Some(32));
        assert_eq!(b.offset("oom_control", "chosen"), Some(40));
        assert_eq!(b.offset("task_struct", "no_such_member"), None);
    }

    #[test]
    fn resolves_everything_tools_need() {
        let b = saved();
        let t = b.task_offsets();
        assert_eq!(t.valid, 1);
        // Member inside an anonymous union/struct of mm_struct.
        assert!(t.mm_brk > 0 && t.mm_rss_stat > 0);
        // 6.18: struct percpu_counter rss_stat[], the shared count at 8.
        assert_eq!((t.rss_stride, t.rss_count), (40, 8));
        assert!(b.enumerator("cgroup_subsys_id", "memory_cgrp_id").is_some());
        assert!(b.has_func("oom_kill_process"));
        assert!(b.has_btf_tracepoint("mark_victim"));
        assert!(!b.has_btf_tracepoint("no_such_tracepoint"));
    }
}
