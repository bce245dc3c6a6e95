//! DWARF unwinding inside the kernel programs (`--stack-mode dwarf` with
//! tables): userspace compiles each file's `.eh_frame` into sorted rows,
//! shared by every process that maps the file, and keeps per process a
//! small table of its executable mappings; the program looks both up frame
//! by frame.

/// How to step from a frame to its caller: one of the few rules a file's
/// code uses. Rows name rules by index into `UNWIND_RULES`, each rule kept
/// once however many rows and files use it (a few thousand on a host).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UnwindRule {
    /// `row::RSP`, `row::RBP`: CFA = register + `cfa_off`. `row::PLT`: the
    /// threshold of the PLT's CFA expression. `row::SIGNAL`: see there.
    pub cfa_off: i16,
    /// The caller's rbp is saved at CFA + 8 * `rbp_off`; 0: rbp unchanged.
    pub rbp_off: i8,
    pub kind: u8,
}

/// A file's slice of `UNWIND_ROWS` (4-byte words), by 64 KiB page of its
/// stated addresses so that a row needs only the low 16 bits of its pc:
/// `[first page, pages, page starts (pages + 1, relative to the slice),
/// rows]`. A row is `pc & 0xffff` << 16 | rule index, sorted within its
/// page, and every page starts with a row at 0 (the rule in force there).
pub mod slice {
    pub const FIRST_PAGE: u32 = 0;
    pub const PAGES: u32 = 1;
    pub const STARTS: u32 = 2;
    pub const PAGE_SHIFT: u32 = 16;
    /// Rule index 0: no unwind information.
    pub const RULE_NONE: u16 = 0;
    /// Rules kept (the index is 16 bits).
    pub const MAX_RULES: u32 = 1 << 16;
}

pub mod row {
    /// No unwind information here (between FDEs).
    pub const NONE: u8 = 0;
    pub const RSP: u8 = 1;
    pub const RBP: u8 = 2;
    /// The PLT's expression: CFA = rsp + 8 + ((rip & 15) >= off ? 8 : 0).
    pub const PLT: u8 = 3;
    /// The outermost frame: the return address is undefined (`_start`).
    pub const END: u8 = 4;
    /// A rule the rows cannot express (counted when the table is built).
    pub const UNSUPPORTED: u8 = 5;
    /// A signal frame (`__restore_rt`): the interrupted registers are saved
    /// at rsp: its sp at rsp + `cfa_off` (the CFA), its ip just above, its
    /// rbp at rsp + 8 * `rbp_off`. The ip is not a return address.
    pub const SIGNAL: u8 = 6;
    /// Go's switch to another stack (`runtime.systemstack` and its kind):
    /// the callers are on the stack left, which the rows cannot find.
    pub const SWITCH: u8 = 7;
}

/// An executable mapping of a process: `[start, end)`, file-relative pc =
/// pc - `bias`, its file's slice `[rows, rows + nrows)` of `UNWIND_ROWS`
/// (`slice`; none: no unwind information, e.g. JIT code or a file without
/// `.eh_frame`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindMapping {
    pub start: u64,
    pub end: u64,
    pub bias: u64,
    pub rows: u32,
    pub nrows: u32,
}

/// Executable mappings kept per process (sorted by start); more are counted.
pub const MAX_UNWIND_MAPPINGS: usize = 128;
/// Binary-search steps over a process's mappings: log2(MAX_UNWIND_MAPPINGS) + 1.
pub const MAPPING_STEPS: usize = 8;
/// Binary-search steps over one page's rows (at most 1 << 16 of them):
/// log2 + 1.
pub const ROW_STEPS: usize = 17;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UnwindProc {
    pub nr: u32,
    /// Changes with every update of the process's table: rows the program
    /// cached for an older one are not used.
    pub gen: u32,
    pub maps: [UnwindMapping; MAX_UNWIND_MAPPINGS],
}

/// Marks put in place of a frame to say why an in-kernel unwind stopped
/// early; never a user address (those stay below 2^47).
pub mod mark {
    pub const BASE: u64 = 0xffff_ffff_ffff_ff00;
    /// Deeper than the frames kept.
    pub const TRUNCATED: u64 = BASE + 1;
    /// Part of the stack met code memtrace had no table for yet (a process
    /// or library not read yet: it is read now) and was walked by frame
    /// pointers from there (`loss::TABLES_PENDING`).
    pub const NO_TABLE: u64 = BASE + 2;
    /// Code without unwind information.
    pub const NO_INFO: u64 = BASE + 3;
    /// A read of the user stack failed.
    pub const READ_FAIL: u64 = BASE + 4;
    /// Code with unwind information whose rule the rows cannot express.
    pub const UNSUPPORTED: u64 = BASE + 5;
    /// Go switched stacks here (`row::SWITCH`).
    pub const SWITCH: u64 = BASE + 6;

    /// Why a stack stopped, for a mark; None for an address.
    pub fn note(ip: u64) -> Option<&'static str> {
        match ip {
            TRUNCATED => Some("truncated: deeper than the frames kept"),
            NO_TABLE => Some(
                "frame pointers walked where unwind tables were not ready yet: callers may be missing",
            ),
            NO_INFO => Some("code without usable unwind information"),
            READ_FAIL => Some("user stack read failed"),
            UNSUPPORTED => Some("an unwind rule memtrace cannot follow here"),
            SWITCH => Some(
                "Go switched to its system stack here: the goroutine's callers are not followed",
            ),
            _ if ip >= BASE => Some("unwind stopped"),
            _ => None,
        }
    }
}

/// Slots of the `UNWIND_STATS` per-CPU counters: how each in-kernel unwind
/// ended.
pub mod stat {
    pub const COMPLETE: u32 = 0;
    pub const TRUNCATED: u32 = 1;
    pub const NO_TABLE: u32 = 2;
    pub const NO_INFO: u32 = 3;
    pub const READ_FAIL: u32 = 4;
    /// Of the complete ones, those that were the stack this CPU unwound
    /// last, found unchanged word for word (`unwind_memo`), not walked again.
    pub const REPEATED: u32 = 5;
    pub const UNSUPPORTED: u32 = 6;
    /// Ended at a Go stack switch (`mark::SWITCH`).
    pub const SWITCHED: u32 = 7;
    pub const NR: u32 = 8;
    pub const NAMES: [&str; NR as usize] = [
        "kunwind_complete",
        "kunwind_truncated",
        "kunwind_fp_walked",
        "kunwind_no_info",
        "kunwind_read_fail",
        "kunwind_repeated",
        "kunwind_unsupported",
        "kunwind_stack_switch",
    ];
}

/// A `kind::UNWIND_MISS` record: process `tgid` ran code in no mapping
/// memtrace has a table for; its maps are to be read again.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UnwindMiss {
    pub kind: u32,
    pub tgid: u32,
}

/// Rows the program found lately, per CPU, by pc: the same return addresses
/// recur in stack after stack, and a hit skips both searches.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RowCache {
    pub pc: u64,
    pub tgid: u32,
    pub gen: u32,
    pub rule: UnwindRule,
}

pub const ROW_CACHE_SLOTS: u32 = 4096;

/// A file's identity: its superblock's device (kernel `dev_t`, major << 20
/// | minor) and inode.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UnwindFileKey {
    pub ino: u64,
    pub dev: u32,
    pub _pad: u32,
}

/// Loadable segments kept per file, to place a mapping's load bias.
pub const MAX_FILE_SEGMENTS: usize = 4;

/// A loadable segment: file offset, size in the file, stated address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileSegment {
    pub off: u64,
    pub size: u64,
    pub vaddr: u64,
}

/// A file's slice of `UNWIND_ROWS` by identity (`UNWIND_FILES`): code in no
/// table of its process yet (a process started a moment ago, a library just
/// loaded) still unwinds when another process's maps brought its file in.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UnwindFile {
    pub rows: u32,
    pub nrows: u32,
    pub nseg: u32,
    pub _pad: u32,
    pub segs: [FileSegment; MAX_FILE_SEGMENTS],
}

/// `UNWIND_VMA` global: what the program reads of the mapping the kernel
/// finds for a pc (`bpf_find_vma`). `valid` 0: no such lookup (a kernel
/// before 5.17, or offsets missing): such code is walked by frame pointers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct VmaOffsets {
    pub vm_start: u32,
    pub vm_pgoff: u32,
    pub vm_file: u32,
    pub file_inode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    pub page_shift: u32,
    pub valid: u32,
}

/// A mapping `bpf_find_vma` found for a process, whose file has rows:
/// `[start, end)`, the file offset at `start`, the file.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FoundMapping {
    pub start: u64,
    pub end: u64,
    pub off: u64,
    pub key: UnwindFileKey,
}

/// Mappings kept per process in `UNWIND_FOUND` (past it, the oldest goes).
pub const MAX_FOUND_MAPPINGS: usize = 8;

/// `UNWIND_FOUND`: the mappings found for a process before it has a table.
/// A page fault's program runs with interrupts off, where `bpf_find_vma`
/// answers once per event (it defers the lock's release to an irq_work,
/// busy until interrupts are back on): every later frame of a process
/// without a table was walked by frame pointers. Kept, each event adds one.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FoundMappings {
    pub nr: u32,
    pub next: u32,
    pub maps: [FoundMapping; MAX_FOUND_MAPPINGS],
}

crate::names! {
    maps {
        UNWIND_STEP: () => (), Compiled;
        UNWIND_ROWS: u32 => u64, OnDemand;
        UNWIND_RULES: u32 => UnwindRule, OnDemand;
        UNWIND_PROCS: u32 => UnwindProc, OnDemand;
        UNWIND_MISSES: u32 => u8, OnDemand;
        UNWIND_FILES: UnwindFileKey => UnwindFile, OnDemand;
        UNWIND_FOUND: u32 => FoundMappings, OnDemand;
        FOUND_SCRATCH: () => (), Compiled;
        VMA_FOUND: () => (), Compiled;
        UNWIND_STATS: u32 => u64, Compiled;
        UNWIND_CACHE: () => (), OnDemand;
        UNWIND_MEMO: () => (), Compiled;
        UNWIND_GEN: u32 => u32, Compiled;
    }
    globals {
        UNWIND_VMA: VmaOffsets;
    }
    progs {
        UNWIND_EXIT = unwind_exit,
    }
}

crate::pod!(
    UnwindRule,
    UnwindProc,
    UnwindFileKey,
    UnwindFile,
    VmaOffsets,
    FoundMapping,
    FoundMappings
);
