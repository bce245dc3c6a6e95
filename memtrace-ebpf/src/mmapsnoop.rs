//! `mmapsnoop`: one record per mmap, munmap, mremap and brk call. Arguments
//! are kept at sys_enter by thread and sent with the result at sys_exit.

use aya_ebpf::Global;
use memtrace_common::{
    kind,
    snoop::{op, FdFileOffsets, MmapSnoopConfig},
};

use crate::helpers::fd_file;

#[unsafe(no_mangle)]
static MMAP_SNOOP: Global<MmapSnoopConfig> = Global::new(MmapSnoopConfig {
    mmap: [0; 6],
    munmap: [0; 2],
    mremap: [0; 5],
    brk: 0,
    mmap_ret: 0,
    munmap_ret: 0,
    mremap_ret: 0,
    brk_ret: 0,
    failed_only: 0,
    self_tgid: 0,
    file: FdFileOffsets::NONE,
});

snoop_programs!(MMAP_SNOOP as c, kind::MMAP_CALL, {
    // The file behind the fd (args[4]), read while it is certainly still
    // open; userspace ignores it for anonymous mappings (fd is unused then).
    mmap_enter, mmap_exit: op::MMAP, args c.mmap, ret c.mmap_ret,
        file |call| fd_file(&c.file, call.args[4]);
    munmap_enter, munmap_exit: op::MUNMAP, args c.munmap, ret c.munmap_ret;
    mremap_enter, mremap_exit: op::MREMAP, args c.mremap, ret c.mremap_ret;
    // Not `brk_enter`: brkstack's programs already have those names.
    snoop_brk_enter, snoop_brk_exit: op::BRK, args [c.brk], ret c.brk_ret;
});
