//! `ffaults`: file-backed page faults by (process, device, inode). The first
//! fault of a process on a file is also sent to userspace, which names the
//! file from the process's maps while the process is alive.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::bpf_get_current_comm,
    macros::{fentry, kprobe, map, tracepoint},
    maps::{LruHashMap, PerCpuHashMap},
    programs::{FEntryContext, ProbeContext, TracePointContext},
    Global,
};
use memtrace_common::{
    ffaults::{FfaultsConfig, FileKey, FileSeen},
    kind, loss, TASK_COMM_LEN,
};

use crate::helpers::{count_gen, count_loss, current_tgid, emit, read, wanted, NO_PREALLOC};

#[unsafe(no_mangle)]
static FFAULT_CFG: Global<FfaultsConfig> = Global::new(FfaultsConfig {
    tp_ino: 0,
    tp_dev: 0,
    vmf_vma: 0,
    vma_file: 0,
    file_inode: 0,
    inode_ino: 0,
    inode_sb: 0,
    sb_dev: 0,
});

#[map]
static FILE_FAULTS: PerCpuHashMap<FileKey, u64> =
    PerCpuHashMap::with_max_entries(16384, NO_PREALLOC);

/// Files already announced to userspace. LRU: one pushed out is announced
/// again (userspace keeps its name), where a full map announced no more.
#[map]
static FILES_SEEN: LruHashMap<FileKey, u8> = LruHashMap::with_max_entries(16384, 0);

#[inline(always)]
fn count(tgid: u32, dev: u32, ino: u64) {
    let key = FileKey {
        tgid,
        dev,
        ino,
        gen: count_gen(),
        _pad: 0,
    };
    // Per-CPU values: no other CPU writes this slot, so a plain add is exact.
    if let Some(v) = FILE_FAULTS.get_ptr_mut(&key) {
        unsafe { *v += 1 };
        return;
    }
    if FILE_FAULTS.insert(&key, &1u64, 0).is_err() {
        count_loss(loss::MAP_FULL);
        return;
    }
    // First fault on this CPU; announce the file once across all CPUs
    // (whatever the generation).
    let key = FileKey { gen: 0, ..key };
    if FILES_SEEN.insert(&key, &1u8, BPF_NOEXIST as u64).is_ok() {
        emit(&FileSeen {
            kind: kind::FILE_SEEN,
            _pad: 0,
            key,
            comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
        });
    }
}

#[tracepoint]
pub fn ffaults_tp(ctx: TracePointContext) -> u32 {
    let tgid = current_tgid();
    if !wanted(tgid) {
        return 0;
    }
    let c = FFAULT_CFG.load();
    // Without them the fault has no file to be counted on: lost, counted.
    let (Ok(ino), Ok(dev)) = (unsafe {
        (
            ctx.read_at::<u64>(c.tp_ino as usize),
            ctx.read_at::<u32>(c.tp_dev as usize),
        )
    }) else {
        count_loss(loss::READ);
        return 0;
    };
    count(tgid, dev, ino);
    0
}

/// `filemap_fault(struct vm_fault *vmf)`: vmf->vma->vm_file->f_inode.
#[inline(always)]
fn on_vmf(vmf: *const u8) {
    let tgid = current_tgid();
    if !wanted(tgid) {
        return;
    }
    let c = FFAULT_CFG.load();
    let r = unsafe {
        read::<*const u8>(vmf, c.vmf_vma)
            .and_then(|vma| read::<*const u8>(vma, c.vma_file))
            .and_then(|file| read::<*const u8>(file, c.file_inode))
            .and_then(|inode| {
                let ino = read::<u64>(inode, c.inode_ino)?;
                let sb = read::<*const u8>(inode, c.inode_sb)?;
                Ok((read::<u32>(sb, c.sb_dev)?, ino))
            })
    };
    match r {
        Ok((dev, ino)) => count(tgid, dev, ino),
        Err(_) => count_loss(loss::READ),
    }
}

#[kprobe]
pub fn ffaults_kprobe(ctx: ProbeContext) -> u32 {
    if let Some(vmf) = ctx.arg::<*const u8>(0) {
        on_vmf(vmf);
    }
    0
}

#[fentry(function = "filemap_fault")]
pub fn ffaults_fentry(ctx: FEntryContext) -> i32 {
    on_vmf(ctx.arg::<*const u8>(0));
    0
}
