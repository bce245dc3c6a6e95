//! Rows for code in no table of its process yet (a process that started a
//! moment ago, a library it just loaded): the kernel's own mapping for the
//! pc (`bpf_find_vma`) names the file, and the file's rows, built already
//! for another process that maps it, are found by its identity. Code whose
//! file memtrace has not met is walked by frame pointers.
// Unused in the compat build: the compat object has no in-kernel unwinder to use it.
#![cfg_attr(feature = "compat", allow(dead_code, unused_imports))]

use aya_ebpf::{
    cty::c_void,
    helpers::generated::{bpf_find_vma, bpf_get_current_task_btf},
    macros::map,
    maps::{HashMap, PerCpuArray},
    Global,
};
use memtrace_common::kunwind::{
    mark, UnwindFile, UnwindFileKey, UnwindRule, VmaOffsets, MAX_FILE_SEGMENTS,
};

use super::{
    reads::{read, read0},
    unwind_rows::find_rule,
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

/// What the callback found of the mapping, the file's identity first (the
/// key `UNWIND_FILES` is looked up with). In map memory: the stack is
/// short in this chain of calls (see `kunwind::Step::next`).
#[repr(C)]
pub struct Found {
    key: UnwindFileKey,
    start: u64,
    pgoff: u64,
    ok: u64,
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
        (*f).pgoff = read0::<u64>(vma, o.vm_pgoff);
        (*f).key.ino = read0::<u64>(inode, o.inode_ino);
        (*f).key.dev = read0::<u32>(sb, o.sb_dev);
        (*f).ok = 1;
    }
    0
}

/// The row for `pc` through the mapping the kernel has for it. Err:
/// `mark::NO_TABLE` where the file has no rows (yet), else why not.
#[inline(always)]
pub(super) fn row_by_vma(pc: u64) -> Result<UnwindRule, u64> {
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
    let t = unsafe { UNWIND_FILES.get(&f.key) }.ok_or(mark::NO_TABLE)?;
    // The file offset the mapping starts at, and the segment holding it.
    let at = f.pgoff << (o.page_shift & 31);
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
            break;
        }
    }
    let rel = pc.wrapping_sub(bias.ok_or(mark::NO_INFO)?);
    if t.nrows == 0 || rel > u32::MAX as u64 {
        return Err(mark::NO_INFO);
    }
    find_rule(t.rows, rel).ok_or(mark::NO_INFO)
}
