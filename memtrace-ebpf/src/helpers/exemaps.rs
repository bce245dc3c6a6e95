//! Executable mappings as they are made, for symbolization after a process
//! is gone: its image at exec (`mm->start_code..end_code` and the binary's
//! identity) and every executable mmap of a file (address, length, offset,
//! identity and name). Rare events: a few per process start.

use aya_ebpf::{
    bindings::BPF_RB_FORCE_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel_str_bytes},
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
    EbpfContext, Global,
};
use memtrace_common::{
    exemaps::{ExeMap, ExeMapPending, ExeMapsConfig},
    kind, loss,
    snoop::FdFileOffsets,
    stack_mode,
};

use super::{
    emit::{count_loss, EVENTS},
    filter::{current_tgid, wanted, FILTER},
    reads::{current_task, fd_file_ptr, file_id, read0},
    unwind_vma::forget_found,
};

#[unsafe(no_mangle)]
static EXEMAPS_CFG: Global<ExeMapsConfig> = Global::new(ExeMapsConfig {
    mmap: [0; 5],
    mmap_ret: 0,
    exec_filename: 0,
    task_mm: 0,
    mm_exe_file: 0,
    mm_start_code: 0,
    mm_end_code: 0,
    file_dentry: 0,
    dentry_name: 0,
    file: FdFileOffsets::NONE,
    valid: 0,
});

/// Executable mmaps between sys_enter and sys_exit, by thread.
#[map]
static EXEMAP_PENDING: HashMap<u32, ExeMapPending> = HashMap::with_max_entries(1, 0);

const PROT_EXEC: u64 = 4;
const MAP_ANONYMOUS: u64 = 0x20;

/// `syscalls:sys_enter_mmap`: a file mapped executable by a traced process;
/// its identity read now, while the fd certainly names it.
#[tracepoint]
pub fn exemap_enter(ctx: TracePointContext) -> u32 {
    let c = EXEMAPS_CFG.load();
    if c.valid == 0 || !wanted(current_tgid()) {
        return 0;
    }
    // The arguments are 8-byte fields in the record's first 64 bytes.
    let Ok(w) = (unsafe { ctx.read_at::<[u64; 8]>(0) }) else {
        count_loss(loss::READ);
        return 0;
    };
    let arg = |i: usize| w[(c.mmap[i] as usize / 8) & 7];
    let (len, prot, flags, fd, off) = (arg(0), arg(1), arg(2), arg(3), arg(4));
    if prot & PROT_EXEC == 0 || flags & MAP_ANONYMOUS != 0 || (fd as i32) < 0 {
        return 0;
    }
    let Ok(file) = fd_file_ptr(&c.file, fd) else {
        count_loss(loss::READ);
        return 0;
    };
    let (dev, ino) = unsafe { file_id(&c.file, file) }.unwrap_or_else(|_| {
        count_loss(loss::READ);
        (0, 0)
    });
    let p = ExeMapPending {
        len,
        pgoff: off,
        file: file as u64,
        ino,
        dev,
        _pad: 0,
    };
    if EXEMAP_PENDING
        .insert(bpf_get_current_pid_tgid() as u32, p, 0)
        .is_err()
    {
        count_loss(loss::MAP_FULL);
    }
    0
}

/// `syscalls:sys_exit_mmap`: where the executable mapping landed.
#[tracepoint]
pub fn exemap_exit(ctx: TracePointContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let tid = id as u32;
    let Some(p) = EXEMAP_PENDING.get_ptr(tid).map(|p| unsafe { *p }) else {
        return 0;
    };
    let _ = EXEMAP_PENDING.remove(tid);
    let c = EXEMAPS_CFG.load();
    let Ok(ret) = (unsafe { ctx.read_at::<i64>(c.mmap_ret as usize) }) else {
        count_loss(loss::READ);
        return 0;
    };
    // A failed call maps nothing.
    if (-4095..0).contains(&ret) {
        return 0;
    }
    // The range may hold another file now.
    if FILTER.load().stacks & stack_mode::KUNWIND != 0 {
        forget_found((id >> 32) as u32);
    }
    let Some(mut e) = EVENTS.reserve::<ExeMap>(0) else {
        count_loss(loss::RINGBUF);
        return 0;
    };
    let r = e.as_mut_ptr();
    unsafe {
        (*r).kind = kind::PROC_MAP;
        (*r).pid = (id >> 32) as u32;
        (*r).start = ret as u64;
        (*r).len = p.len;
        (*r).pgoff = p.pgoff;
        (*r).dev = p.dev;
        (*r)._pad = 0;
        (*r).ino = p.ino;
        (*r).name[0] = 0;
        // The mapping holds the file: its dentry's name is still there.
        let dentry = read0::<*const u8>(p.file as *const u8, c.file_dentry);
        let name = read0::<*const u8>(dentry, c.dentry_name);
        if bpf_probe_read_kernel_str_bytes(name, &mut (*r).name).is_err() {
            (*r).name[0] = 0;
        }
    }
    e.submit(BPF_RB_FORCE_WAKEUP as u64);
    0
}

/// `sched:sched_process_exec`: the new image's code range and the binary's
/// identity (`mm->exe_file`), with the path exec was given.
#[tracepoint]
pub fn exemap_exec(ctx: TracePointContext) -> u32 {
    let c = EXEMAPS_CFG.load();
    let tgid = current_tgid();
    if c.valid == 0 || !wanted(tgid) {
        return 0;
    }
    let Some(mut e) = EVENTS.reserve::<ExeMap>(0) else {
        count_loss(loss::RINGBUF);
        return 0;
    };
    let r = e.as_mut_ptr();
    unsafe {
        let mm = read0::<*const u8>(current_task(), c.task_mm);
        let exe = read0::<*const u8>(mm, c.mm_exe_file);
        let start = read0::<u64>(mm, c.mm_start_code);
        let end = read0::<u64>(mm, c.mm_end_code);
        let (dev, ino) = file_id(&c.file, exe).unwrap_or((0, 0));
        if ino == 0 || end <= start {
            count_loss(loss::READ);
        }
        (*r).kind = kind::PROC_IMAGE;
        (*r).pid = tgid;
        (*r).start = start;
        (*r).len = end.saturating_sub(start);
        (*r).pgoff = 0;
        (*r).dev = dev;
        (*r)._pad = 0;
        (*r).ino = ino;
        (*r).name[0] = 0;
        // `__data_loc`: the string's offset in the record, low 16 bits.
        let loc = ctx.read_at::<u32>(c.exec_filename as usize).unwrap_or(0);
        let src = (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize);
        if loc == 0 || bpf_probe_read_kernel_str_bytes(src, &mut (*r).name).is_err() {
            (*r).name[0] = 0;
            count_loss(loss::READ);
        }
    }
    e.submit(BPF_RB_FORCE_WAKEUP as u64);
    0
}
