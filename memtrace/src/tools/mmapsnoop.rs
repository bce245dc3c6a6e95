//! `memtrace mmapsnoop`: one line per mmap, munmap, mremap and brk call, with
//! its arguments decoded, the file mapped and the result or errno.

use memtrace_common::{
    kind,
    snoop::{self, op, FdFileOffsets, MmapSnoopConfig, SyscallEvent},
    stack_mode,
};

use memtrace_common::names;

use crate::error::Result;
use crate::output::{clock, Col, Printer, Row, Value};
use crate::probes::syscalls::decode::{errno_name, mmap_flags, mremap_flags, prot};
use crate::probes::syscalls::{arg_offsets, hex, ret_offset, self_tgid};
use crate::process::proc::split_dev;
use crate::run::tool::{About, Prep, Tool};
use crate::session::attach::Probe;
use crate::session::records::{comm, record};
use crate::stacks::symbolize::{read_maps, Mapping};
use crate::stacks::Traced;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::run::args::Common,
    /// Show the user stack of each call.
    #[arg(long)]
    pub stack: bool,
    #[command(flatten)]
    pub stacks: crate::stacks::args::StackArgs,
    /// Show only failed calls (filtered in the kernel).
    #[arg(short = 'x', long = "failed")]
    pub failed: bool,
}

pub fn probes() -> Vec<Probe> {
    vec![
        Probe::new("mmap entry").tracepoint(names::MMAP_ENTER, "syscalls", "sys_enter_mmap"),
        Probe::new("mmap return").tracepoint(names::MMAP_EXIT, "syscalls", "sys_exit_mmap"),
        Probe::new("munmap entry").tracepoint(names::MUNMAP_ENTER, "syscalls", "sys_enter_munmap"),
        Probe::new("munmap return").tracepoint(names::MUNMAP_EXIT, "syscalls", "sys_exit_munmap"),
        Probe::new("mremap entry").tracepoint(names::MREMAP_ENTER, "syscalls", "sys_enter_mremap"),
        Probe::new("mremap return").tracepoint(names::MREMAP_EXIT, "syscalls", "sys_exit_mremap"),
        Probe::new("brk entry").tracepoint(names::SNOOP_BRK_ENTER, "syscalls", "sys_enter_brk"),
        Probe::new("brk return").tracepoint(names::SNOOP_BRK_EXIT, "syscalls", "sys_exit_brk"),
    ]
}

const COLS: [Col; 12] = [
    Col::text("time", "TIME", 8),
    Col::num("pid", "PID", 7),
    Col::text("comm", "COMM", 16),
    Col::text("op", "OP", 6),
    Col::text("addr", "ADDR", 14),
    Col::num("len", "LEN", 10),
    Col::num("new_len", "NEWLEN", 10),
    Col::text("prot", "PROT", 4),
    Col::text("flags", "FLAGS", 26),
    Col::num("fd", "FD", 4),
    Col::text("result", "RESULT", 14),
    // Last: paths have no useful width.
    Col::text("file", "FILE", 4),
];

/// Path of the file an mmap call of `pid` mapped, `file` being the (kernel
/// dev_t, inode) the kernel found behind the fd, or (0, 0). In order: the
/// mapping now at the returned address with the call's file offset (from
/// /proc/PID/maps); /proc/PID/fd/FD if it is still that file; any mapping of
/// that file; else the device and inode. The descriptor is often closed and
/// its number reused before the record arrives (ld.so maps every library
/// through fd 3 in turn), hence the checks.
fn mapped_file(pid: u32, fd: i32, mapped: Option<(u64, u64)>, file: (u32, u64)) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let (kdev, ino) = file;
    let dev = split_dev(kdev);
    let same = |m: &Mapping| m.inode != 0 && (ino == 0 || (m.inode == ino && m.dev == dev));
    let maps = read_maps(pid).unwrap_or_default();
    if let Some((addr, off)) = mapped {
        if let Some(m) = maps
            .iter()
            .find(|m| m.start == addr && m.offset == off && same(m))
        {
            return Some(m.path.to_string());
        }
    }
    let link = format!("/proc/{pid}/fd/{fd}");
    // Inode only: stat's st_dev is not always the superblock's (btrfs).
    let fd_same = ino == 0 || std::fs::metadata(&link).is_ok_and(|md| md.ino() == ino);
    if fd_same {
        if let Ok(p) = std::fs::read_link(&link) {
            return Some(p.to_string_lossy().into_owned());
        }
    }
    if ino == 0 {
        return None;
    }
    if let Some(m) = maps.iter().find(|m| same(m)) {
        return Some(m.path.to_string());
    }
    Some(format!("[inode {ino} on {}:{}]", dev.0, dev.1))
}

/// The kernel offsets from a task's fd to its file's inode. Optional: where
/// BTF lacks them, files are named from /proc alone, and memtrace says so.
fn fd_file_offsets(k: &mut Prep) -> FdFileOffsets {
    k.btf()
        .and_then(|b| b.fd_file_offsets())
        .unwrap_or_else(|e| {
            say!("memtrace: warning: mapped files named from /proc only: {e}");
            FdFileOffsets::default()
        })
}

pub struct Mmapsnoop {
    args: Args,
    calls: u64,
    failed: u64,
}

impl Mmapsnoop {
    pub fn new(a: &Args) -> Result<Self> {
        Ok(Mmapsnoop {
            args: a.clone(),
            calls: 0,
            failed: 0,
        })
    }

    fn row(&self, ev: &SyscallEvent) -> Row {
        let a = ev.args;
        let failed = snoop::failed(ev.op, a[0], ev.ret);
        let null = || Value::Null;
        let (name, addr, len, new_len, prot_s, flags, fd, file) = match ev.op {
            op::MMAP => {
                let fd = a[4] as i32;
                let anon = a[3] & libc::MAP_ANONYMOUS as u64 != 0;
                let file = if anon || fd < 0 {
                    Value::Null
                } else {
                    let at = (!failed).then_some((ev.ret as u64, a[5]));
                    mapped_file(ev.pid, fd, at, (ev.file_dev, ev.file_ino)).into()
                };
                (
                    "mmap",
                    hex(a[0]),
                    Value::U(a[1]),
                    null(),
                    Value::S(prot(a[2])),
                    Value::S(mmap_flags(a[3])),
                    Value::I(fd as i64),
                    file,
                )
            }
            op::MUNMAP => (
                "munmap",
                hex(a[0]),
                Value::U(a[1]),
                null(),
                null(),
                null(),
                null(),
                null(),
            ),
            op::MREMAP => (
                "mremap",
                hex(a[0]),
                Value::U(a[1]),
                Value::U(a[2]),
                null(),
                Value::S(mremap_flags(a[3])),
                null(),
                null(),
            ),
            _ => (
                "brk",
                hex(a[0]),
                null(),
                null(),
                null(),
                null(),
                null(),
                null(),
            ),
        };
        let result = match (failed, ev.op) {
            // brk returns the unchanged break on failure; C libraries report ENOMEM.
            (true, op::BRK) => "ENOMEM".to_string(),
            (true, _) => errno_name(ev.ret),
            (false, op::MUNMAP) => ev.ret.to_string(),
            (false, _) => format!("{:#x}", ev.ret as u64),
        };
        Row(vec![
            clock().into(),
            ev.pid.into(),
            comm(&ev.comm).into(),
            name.into(),
            addr,
            len,
            new_len,
            prot_s,
            flags,
            fd,
            result.into(),
            file,
        ])
    }
}

pub const ABOUT: About = About {
    name: "mmapsnoop",
    help: "One line per mmap, munmap, mremap and brk call, with its result",
    traces: "mmap, munmap, mremap and brk calls",
    interval: None,
};

impl Tool for Mmapsnoop {
    fn about(&self) -> &'static About {
        &ABOUT
    }
    fn what(&self) -> String {
        let which = if self.args.failed { "failed " } else { "" };
        format!("{which}mmap, munmap, mremap and brk calls")
    }
    fn probes(&self) -> Vec<Probe> {
        probes()
    }
    fn user_stacks(&self) -> Option<(&crate::stacks::args::StackArgs, bool)> {
        // One line per call is printed anyway: a stack copy per call fits.
        self.args.stack.then_some((&self.args.stacks, true))
    }
    fn stack_mode(&self) -> u32 {
        if self.args.stack {
            stack_mode::USER
        } else {
            0
        }
    }

    fn prepare(&mut self, k: &mut Prep) -> Result<()> {
        let cfg = MmapSnoopConfig {
            mmap: arg_offsets(
                k,
                "sys_enter_mmap",
                ["addr", "len", "prot", "flags", "fd", "off"],
            )?,
            munmap: arg_offsets(k, "sys_enter_munmap", ["addr", "len"])?,
            mremap: arg_offsets(
                k,
                "sys_enter_mremap",
                ["addr", "old_len", "new_len", "flags", "new_addr"],
            )?,
            brk: arg_offsets(k, "sys_enter_brk", ["brk"])?[0],
            mmap_ret: ret_offset(k, "sys_exit_mmap")?,
            munmap_ret: ret_offset(k, "sys_exit_munmap")?,
            mremap_ret: ret_offset(k, "sys_exit_mremap")?,
            brk_ret: ret_offset(k, "sys_exit_brk")?,
            failed_only: self.args.failed as u32,
            self_tgid: self_tgid(),
            file: fd_file_offsets(k),
        };
        k.loader.global(names::MMAP_SNOOP, &cfg);
        k.loader.max_entries(names::SNOOP_PENDING, 4096);
        // One record per call. Bursts of calls (an allocator warming up) outrun any consumer for a
        // moment: 2 MiB holds about 16k records, and is 4 MiB resident (mapped twice);
        // --buffer-size trades memory for more.
        k.loader.max_entries(names::EVENTS, 2 << 20);
        Ok(())
    }

    fn on_record(&mut self, data: &[u8], s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        let Some(ev) = record::<SyscallEvent>(data, kind::MMAP_CALL) else {
            return Ok(());
        };
        self.calls += 1;
        if snoop::failed(ev.op, ev.args[0], ev.ret) {
            self.failed += 1;
        }
        let row = self.row(&ev);
        if self.args.stack {
            let mut frames = s.thread_user_frames(ev.pid, Some(ev.tid), ev.ustack, 0);
            if ev.ustack == -1 {
                frames.push("[stack capture failed (counted in stack_fail)]".into());
            }
            out.event_stack("mmap_call", &COLS, &row, &frames);
        } else {
            out.event("mmap_call", &COLS, &row);
        }
        Ok(())
    }

    fn events(&self) -> u64 {
        self.calls
    }

    fn summary_extra(&self) -> Vec<(&'static str, Value)> {
        vec![("failed", self.failed.into())]
    }
}
