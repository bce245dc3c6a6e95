//! Rows for code in no table of its process yet (a process that started a
//! moment ago, a library it just loaded): the kernel's own mapping for the
//! pc (`bpf_find_vma`) names the file, and the file's rows, built already
//! for another process that maps it, are found by its identity. Code whose
//! file memtrace has not met is walked by frame pointers.
// Unused in the compat build: the compat object has no in-kernel unwinder to use it.
#![cfg_attr(feature = "compat", allow(dead_code, unused_imports))]

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    cty::c_void,
    helpers::generated::{bpf_find_vma, bpf_get_current_task_btf},
    macros::map,
    maps::{HashMap, PerCpuArray},
    Global,
};
use memtrace_common::kunwind::{
    mark, FoundMapping, FoundMappings, UnwindFile, UnwindFileKey, UnwindRule, VmaOffsets,
    MAX_FILE_SEGMENTS, MAX_FOUND_MAPPINGS,
};

use super::{
    reads::{read, read0},
    unwind_rows::find_rule,
    NO_PREALLOC,
};

#[unsafe(no_mangle)]
static UNWIND_VMA: Global<VmaOffsets> = Global::new(VmaOffsets {
    vm_start: 0,
    vm_pgoff: 0,
    vm_file: 0,
    file_inode: 0,
    inode_ino: 0,
    inode_sb: 0,
    sb_dev: 0,
    page_shift: 0,
    valid: 0,
});

/// Every file with rows, by identity; userspace sizes and fills it.
#[map]
static UNWIND_FILES: HashMap<UnwindFileKey, UnwindFile> = HashMap::with_max_entries(1, 0);

/// Per process, the mappings found so far (`FoundMappings`): userspace
/// sizes it; its entry goes with the process's table (exec, exit).
#[map]
static UNWIND_FOUND: HashMap<u32, FoundMappings> = HashMap::with_max_entries(1, NO_PREALLOC);

/// A process's first entry is built here (too big for the stack).
#[map]
static FOUND_SCRATCH: PerCpuArray<FoundMappings> = PerCpuArray::with_max_entries(1, 0);

/// What the callback found of the mapping, the file's identity first (the
/// key `UNWIND_FILES` is looked up with). In map memory: the stack is
/// short in this chain of calls (see `kunwind::Step::next`).
#[repr(C)]
pub struct Found {
    key: UnwindFileKey,
    start: u64,
    end: u64,
    /// The file offset at `start`, in bytes (pages, as the callback reads it).
    off: u64,
    ok: u64,
}

/// The mappings found for a process go with its table (exec, exit) and
/// when it maps code (a range may now hold another file).
#[inline(always)]
pub(super) fn forget_found(tgid: u32) {
    let _ = UNWIND_FOUND.remove(&tgid);
}

/// A forked child has its parent's mappings.
#[inline(always)]
pub(super) fn inherit_found(parent: u32, child: u32) {
    if let Some(p) = unsafe { UNWIND_FOUND.get(&parent) } {
        let _ = UNWIND_FOUND.insert(&child, p, 0);
    }
}

/// The process's found mapping holding `pc`, into `f`. Subprograms, both:
/// inlined, they took 48 bytes of the frame step's stack, past 6.1's 512
/// for the whole chain ("combined stack size of 4 calls is 544").
#[inline(never)]
fn recall(tgid: u32, pc: u64, f: &mut Found) -> bool {
    let Some(m) = UNWIND_FOUND.get_ptr(&tgid) else {
        return false;
    };
    let m = unsafe { &*m };
    for i in 0..MAX_FOUND_MAPPINGS {
        let e = &m.maps[i];
        if (i as u32) < m.nr && e.start <= pc && pc < e.end {
            f.key = e.key;
            f.start = e.start;
            f.end = e.end;
            f.off = e.off;
            f.ok = 1;
            return true;
        }
    }
    false
}

/// Keeps a mapping found for the process (the oldest goes when full).
#[inline(never)]
fn remember(tgid: u32, f: &Found) {
    let put = |e: &mut FoundMapping| {
        e.start = f.start;
        e.end = f.end;
        e.off = f.off;
        e.key = f.key;
    };
    if let Some(m) = UNWIND_FOUND.get_ptr_mut(&tgid) {
        let m = unsafe { &mut *m };
        let i = if (m.nr as usize) < MAX_FOUND_MAPPINGS {
            m.nr += 1;
            m.nr - 1
        } else {
            m.next = m.next.wrapping_add(1);
            m.next
        };
        put(&mut m.maps[i as usize & (MAX_FOUND_MAPPINGS - 1)]);
        return;
    }
    let Some(s) = FOUND_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    let s = unsafe { &mut *s };
    s.nr = 1;
    s.next = 0;
    put(&mut s.maps[0]);
    // Full: this process's later events find the mapping again (one frame
    // an event), as before the table of found mappings.
    let _ = UNWIND_FOUND.insert(&tgid, s, BPF_NOEXIST as u64);
}

#[map]
static VMA_FOUND: PerCpuArray<Found> = PerCpuArray::with_max_entries(1, 0);

/// `bpf_find_vma`'s callback: the mapping's start, file offset and file,
/// written where `ctx` points.
#[inline(never)]
extern "C" fn on_vma(_task: *mut c_void, vma: *mut c_void, ctx: *mut c_void) -> i64 {
    let o = UNWIND_VMA.load();
    let f = unsafe { *(ctx as *const *mut Found) };
    let vma = vma as *const u8;
    unsafe {
        let Ok(file) = read::<*const u8>(vma, o.vm_file) else {
            return 0;
        };
        let Ok(inode) = read::<*const u8>(file, o.file_inode) else {
            return 0;
        };
        let Ok(sb) = read::<*const u8>(inode, o.inode_sb) else {
            return 0;
        };
        (*f).start = read0::<u64>(vma, o.vm_start);
        // In pages: shifted by the caller (this callback's stack counts in
        // 6.1's 512 bytes for the whole chain of calls).
        (*f).off = read0::<u64>(vma, o.vm_pgoff);
        (*f).key.ino = read0::<u64>(inode, o.inode_ino);
        (*f).key.dev = read0::<u32>(sb, o.sb_dev);
        (*f).ok = 1;
    }
    0
}

/// The row for `pc` of process `tgid` through the mapping the kernel has
/// for it. Err: `mark::NO_TABLE` where the file has no rows (yet), else
/// why not.
#[inline(always)]
pub(super) fn row_by_vma(tgid: u32, pc: u64) -> Result<UnwindRule, u64> {
    let o = UNWIND_VMA.load();
    if o.valid == 0 {
        return Err(mark::NO_TABLE);
    }
    let Some(f) = VMA_FOUND.get_ptr_mut(0) else {
        return Err(mark::NO_TABLE);
    };
    let f = unsafe { &mut *f };
    f.ok = 0;
    f.key._pad = 0;
    let recalled = recall(tgid, pc, f);
    if !recalled {
        // The callback's context: one pointer on the stack.
        let mut at_f = f as *mut Found;
        let r = unsafe {
            bpf_find_vma(
                bpf_get_current_task_btf(),
                pc,
                on_vma as *mut c_void,
                &mut at_f as *mut *mut Found as *mut c_void,
                0,
            )
        };
        if r != 0 || f.ok == 0 {
            return Err(mark::NO_TABLE);
        }
    }
    let t = unsafe { UNWIND_FILES.get(&f.key) }.ok_or(mark::NO_TABLE)?;
    if !recalled {
        f.off <<= o.page_shift & 31;
    }
    // The file offset the mapping starts at, and the segment holding it.
    let at = f.off;
    let page = 1u64 << (o.page_shift & 31);
    let mut bias = None;
    for i in 0..MAX_FILE_SEGMENTS {
        let s = &t.segs[i];
        if (i as u32) < t.nseg && s.off & !(page - 1) <= at && at < s.off + s.size.max(1) {
            bias = Some(
                f.start
                    .wrapping_sub(at)
                    .wrapping_add(s.off)
                    .wrapping_sub(s.vaddr),
            );
            if !recalled {
                // The mapping holds at least the rest of the segment.
                f.end = f.start.wrapping_add(s.off + s.size - at);
                remember(tgid, f);
            }
            break;
        }
    }
    let rel = pc.wrapping_sub(bias.ok_or(mark::NO_INFO)?);
    if t.nrows == 0 || rel > u32::MAX as u64 {
        return Err(mark::NO_INFO);
    }
    find_rule(t.rows, rel).ok_or(mark::NO_INFO)
}
