//! Executable mappings learned in the kernel as they are made (each exec's
//! image and each executable mmap of a file, with the file's device and
//! inode), so that the stacks of a process that execs and exits before its
//! /proc maps could be read still symbolize, in the image they were taken in.
//! Optional: where the programs cannot be set up, maps come from /proc alone
//! and -v says why.

use memtrace_common::exemaps::{ExeMap, ExeMapsConfig};
use memtrace_common::{kind, names};

use crate::error::Result;
use crate::kernel::tracefs::Format;
use crate::kernel::KernelBtf;
use crate::session::attach::Probe;
use crate::session::Loader;
use crate::stacks::Traced;

/// Threads inside an executable mmap at once, at most.
const PENDING: u32 = 1024;

fn config() -> Result<ExeMapsConfig> {
    let [len, prot, flags, fd, off] = crate::probes::syscalls::word_offsets(
        "sys_enter_mmap",
        ["len", "prot", "flags", "fd", "off"],
    )?;
    let [ret] = crate::probes::syscalls::word_offsets("sys_exit_mmap", ["ret"])?;
    let exec = Format::load("sched", "sched_process_exec")?;
    let btf = KernelBtf::shared()?;
    let file = btf.fd_file_offsets()?;
    let mut r = btf.resolver();
    let cfg = ExeMapsConfig {
        mmap: [len, prot, flags, fd, off],
        mmap_ret: ret,
        exec_filename: exec.offset("filename")?,
        task_mm: r.member("task_struct", "mm"),
        mm_exe_file: r.member("mm_struct", "exe_file"),
        mm_start_code: r.member("mm_struct", "start_code"),
        mm_end_code: r.member("mm_struct", "end_code"),
        file_dentry: r.member("file", "f_path") + r.member("path", "dentry"),
        dentry_name: r.member("dentry", "d_name") + r.member("qstr", "name"),
        file,
        valid: 1,
    };
    r.done("the executable-mapping offsets", cfg)
}

/// Sets the programs up when the tool takes user stacks; false (and, with
/// -v, why) when this kernel lacks what they read.
pub fn configure(loader: &mut Loader, verbose: bool) -> bool {
    match config() {
        Ok(cfg) => {
            loader.global(names::EXEMAPS_CFG, &cfg);
            loader.max_entries(names::EXEMAP_PENDING, PENDING);
            true
        }
        Err(e) => {
            if verbose {
                say!(
                    "memtrace: maps from /proc only (no executable mappings from the kernel): {e}"
                );
            }
            false
        }
    }
}

fn probes() -> [Probe; 3] {
    [
        Probe::new("executable mmaps")
            .tracepoint(names::EXEMAP_ENTER, "syscalls", "sys_enter_mmap")
            .optional(),
        Probe::new("executable mmap returns")
            .tracepoint(names::EXEMAP_EXIT, "syscalls", "sys_exit_mmap")
            .optional(),
        Probe::new("exec images")
            .tracepoint(names::EXEMAP_EXEC, "sched", "sched_process_exec")
            .optional(),
    ]
}

/// Attaches the programs; true when all did. Otherwise the maps of
/// processes come from /proc alone, as -v says.
pub fn attach(s: &mut Traced, verbose: bool) -> Result<bool> {
    for p in probes() {
        if let Err(why) = s.first_way(&p) {
            if verbose {
                say!(
                    "memtrace: maps from /proc only: {} not traced: {why}",
                    p.what
                );
            }
            return Ok(false);
        }
    }
    Ok(true)
}

/// A `PROC_IMAGE` or `PROC_MAP` record: the mapping joins its process's
/// current image. False for any other record.
pub fn on_record(data: &[u8], s: &mut Traced) -> bool {
    let Some(k @ (kind::PROC_MAP | kind::PROC_IMAGE)) = crate::session::records::kind_of(data)
    else {
        return false;
    };
    let Some(ev) = crate::session::records::record::<ExeMap>(data, k) else {
        return true;
    };
    let n = ev
        .name
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(ev.name.len());
    let name = &ev.name[..n];
    let mut maps = s.sym.maps.lock().unwrap();
    if k == kind::PROC_IMAGE {
        maps.exec_learned(&ev, name);
    } else {
        maps.map_learned(&ev, name);
    }
    true
}
