//! Types shared by the kernel programs and userspace: ring-buffer records,
//! map keys and values, and the offset tables userspace fills in at load time.
//! Everything is `#[repr(C)]` and plain old data.
#![no_std]

pub mod naming;

/// The modules, one line each: a module's types, and the names of its
/// programs, maps and globals in the object (its `names!`), gathered into
/// `names` (every name) with the lists the loader and its test read.
macro_rules! modules {
    ($($m:ident),* $(,)?) => {
        $(pub mod $m;)*

        /// Every program, map and global of the eBPF object, by name.
        pub mod names {
            pub use crate::naming::{GlobalName, MapName, Prog, Sizing};
            pub use crate::shared::names::*;
            $(pub use crate::$m::names::*;)*
            /// Every map with its sizing policy, module by module.
            pub const ALL_MAPS: &[&[(&str, Sizing)]] =
                &[crate::shared::name_lists::MAPS, $(crate::$m::name_lists::MAPS),*];
            pub const ALL_GLOBALS: &[&[&str]] =
                &[crate::shared::name_lists::GLOBALS, $(crate::$m::name_lists::GLOBALS),*];
            pub const ALL_PROGS: &[&[Prog]] =
                &[crate::shared::name_lists::PROGS, $(crate::$m::name_lists::PROGS),*];
        }
    };
}

modules! {
    brk,
    compact,
    exemaps,
    faults,
    ffaults,
    generic,
    kunwind,
    memcg,
    memleak,
    oom,
    python,
    reclaim,
    rss,
    shim,
    snoop,
    stacks,
    swapin,
    top,
}

/// What every tool's programs share: the ring buffer, the loss counters,
/// the process filter and following, names at exec.
mod shared {
    use crate::{ExecName, Filter, TaskOffsets};

    crate::names! {
        maps {
            EVENTS: () => (), Compiled;
            LOSSES: u32 => u64, Compiled;
            COUNT_GEN: u32 => u32, Compiled;
            BUSY: u32 => u32, Compiled;
            FOLLOWED: u32 => u8, OnDemand;
            EXEC_NAMES: u32 => ExecName, OnDemand;
        }
        globals {
            FILTER: Filter;
            TASK: TaskOffsets;
            WAKE_BYTES: u64;
        }
        progs {
            FOLLOW_FORK = follow_fork,
            NAME_EXEC = name_exec,
            FLOOR_TP = floor_tp,
            FLOOR_RAW = floor_raw,
        }
    }
}

pub const TASK_COMM_LEN: usize = 16;

/// Indexes of the per-CPU loss counters (`LOSSES` map): every way an event can
/// be lost in the kernel is counted here and shown to the user.
pub mod loss {
    /// The ring buffer was full when a record was reserved.
    pub const RINGBUF: u32 = 0;
    /// `bpf_get_stackid` failed (hash collision or stack map full).
    pub const STACK: u32 = 1;
    /// An aggregation map was full when a new key was inserted.
    pub const MAP_FULL: u32 = 2;
    /// A kernel memory or tracepoint field read failed.
    pub const READ: u32 = 3;
    /// `--stack-mode dwarf`: not even part of the user stack could be copied.
    pub const STACK_COPY: u32 = 4;
    /// A frame-pointer walk stopped at its bound (frames kept or stack
    /// pages copied) with the chain still going: the event keeps a stack
    /// without its outer frames.
    pub const STACK_TRUNCATED: u32 = 5;
    /// A new key could not be stored though the map had room: no memory
    /// for it where the program ran (an interrupt, or inside the
    /// allocator the program traces).
    pub const MAP_BUSY: u32 = 6;
    /// A traced call whose return was never seen (the entry of the next
    /// call on the thread found it still pending): longjmp, or a return
    /// probe the kernel could not place.
    pub const MISSED_RETURN: u32 = 7;
    /// Counted while the count map was full, without process or stack
    /// (faults): a degradation, not a loss.
    pub const SPILLED: u32 = 8;
    /// A user stack unwound in the kernel met code whose unwind table was
    /// not ready yet (a process seen for the first time) and was walked by
    /// frame pointers from there: kept, maybe without some callers.
    pub const TABLES_PENDING: u32 = 9;
    /// A process's first count on a stack its image shares could not be
    /// told to userspace (ring buffer full): the count is exact, the row's
    /// number of processes is short.
    pub const MEMBER_LOST: u32 = 10;
    pub const NR: u32 = 11;
    pub const NAMES: [&str; NR as usize] = [
        "ringbuf_full",
        "stack_fail",
        "map_full",
        "read_fail",
        "stack_copy_fail",
        "stack_truncated",
        "map_busy",
        "missed_return",
        "count_spilled",
        "tables_pending",
        "processes_uncounted",
    ];
}

/// First field of every ring-buffer record, so userspace can dispatch.
pub mod kind {
    pub const OOM: u32 = 1;
    pub const FILE_SEEN: u32 = 2;
    pub const RECLAIM: u32 = 3;
    pub const RSS_CROSS: u32 = 4;
    /// mmap, munmap, mremap or brk (`snoop::SyscallEvent`).
    pub const MMAP_CALL: u32 = 5;
    /// shmget, shmat, shmdt or shmctl (`snoop::SyscallEvent`).
    pub const SHM_CALL: u32 = 6;
    /// Registers and a copy of the user stack (`stacks::StackSample`).
    pub const STACK_SAMPLE: u32 = 7;
    /// One tracepoint record (`generic::TraceHdr` and the record's bytes).
    pub const TRACE: u32 = 8;
    /// A followed process forked one (`ProcEvent`).
    pub const PROC_FORK: u32 = 9;
    /// A followed process exec'd (`ProcEvent`).
    pub const PROC_EXEC: u32 = 10;
    /// A watched memory cgroup crossed its warning line (`memcg::MemcgCross`).
    pub const MEMCG_CROSS: u32 = 11;
    /// A process ran code no unwind table covers (`kunwind::UnwindMiss`).
    pub const UNWIND_MISS: u32 = 12;
    /// A traced process mapped a file executable (`exemaps::ExeMap`).
    pub const PROC_MAP: u32 = 13;
    /// A traced process's image at exec (`exemaps::ExeMap`).
    pub const PROC_IMAGE: u32 = 14;
    /// A watched memory cgroup's usage crossed a tenth of its limit
    /// (`memcg::MemcgCross`).
    pub const MEMCG_STEP: u32 = 15;
    /// A process counted on a stack keyed by its image (`stacks::StackMember`).
    pub const STACK_MEMBER: u32 = 16;
    /// A compaction run ended (`compact::CompactEvent`).
    pub const COMPACT: u32 = 17;
    /// A followed process exited, with its last counters and peak
    /// (`rss::RssExit`).
    pub const RSS_EXIT: u32 = 18;
}

/// A process the kernel programs follow started or changed image: memtrace
/// reads its maps then, so its stacks symbolize after it is gone.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcEvent {
    pub kind: u32,
    pub pid: u32,
    /// The forking process (`PROC_FORK`); 0 for an exec.
    pub parent: u32,
    pub _pad: u32,
}

/// What a process took at its last exec: its name, and the memory cgroup it
/// was in then (kernfs id; 0 where the task offsets are not loaded), so that
/// a process gone before memtrace could read /proc keeps both.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ExecName {
    pub comm: [u8; TASK_COMM_LEN],
    pub memcg_id: u64,
}

/// Which attach method a program ran under; reported in records so userspace
/// can say where a figure came from.
pub mod method {
    pub const KPROBE: u32 = 1;
    pub const FENTRY: u32 = 2;
    pub const TP_BTF: u32 = 3;
    pub const RAW_TP: u32 = 4;
    pub const TRACEPOINT: u32 = 5;
    pub const PERF_EVENT: u32 = 6;
}

/// Process selection, set as the `FILTER` global.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Filter {
    /// Process id (tgid) to trace; 0 traces every process.
    pub tgid: u32,
    /// Non-zero: also trace processes forked by traced ones (tracked in `FOLLOWED`).
    pub children: u32,
    /// `stack_mode::*` bits: which stacks the tool captures.
    pub stacks: u32,
    /// `sched:sched_process_fork` offset of `child_pid`.
    pub fork_child_pid: u32,
    /// memtrace itself: system-wide, its own faults, calls and stacks are
    /// not the workload's.
    pub myself: u32,
}

pub mod stack_mode {
    pub const USER: u32 = 1;
    pub const KERNEL: u32 = 2;
    /// User stacks copied raw for DWARF unwinding in userspace, not walked
    /// by frame pointers in the kernel.
    pub const DWARF: u32 = 4;
    /// User stacks walked by frame pointers over one copy of the stack, in
    /// the program itself: the kernel's walker faults at every chain's end.
    pub const WALK: u32 = 8;
    /// With WALK: user stacks unwound in the program with the DWARF rows
    /// of `kunwind`, not by frame pointers.
    pub const KUNWIND: u32 = 16;
}

/// Offsets into `struct task_struct` and friends, read from kernel BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TaskOffsets {
    pub pid: u32,
    pub tgid: u32,
    pub comm: u32,
    pub mm: u32,
    pub cgroups: u32,
    pub css_set_subsys: u32,
    pub memory_cgrp_id: u32,
    pub css_cgroup: u32,
    pub cgroup_kn: u32,
    pub kernfs_node_id: u32,
    pub mm_rss_stat: u32,
    pub mm_total_vm: u32,
    pub mm_brk: u32,
    /// Counter `i` of `mm->rss_stat` is a `long` at `mm_rss_stat + i *
    /// rss_stride + rss_count`: `struct percpu_counter rss_stat[]` (its
    /// shared count) since 6.2, `atomic_long_t rss_stat.count[]` before.
    pub rss_stride: u32,
    pub rss_count: u32,
    pub task_cred: u32,
    pub cred_uid: u32,
    pub task_signal: u32,
    pub signal_oom_score_adj: u32,
    /// Page size in kB, to turn page counts into kB.
    pub page_kb: u32,
    /// Non-zero when every offset above was found.
    pub valid: u32,
}

/// A count map's key that carries the count generation (`COUNT_GEN`):
/// userspace takes one generation's keys while programs add to the other's.
pub trait Generational: Copy {
    fn gen(&self) -> u32;
    /// The key with its generation cleared, to merge both generations.
    fn without_gen(self) -> Self;
}

/// A count per process, in a count generation: swap-ins, mmap calls.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ProcKey {
    pub tgid: u32,
    /// The count generation (see `Generational`).
    pub gen: u32,
}

/// Keys whose `gen` field is the generation.
macro_rules! generational {
    ($($key:ty),*) => {$(
        impl Generational for $key {
            fn gen(&self) -> u32 {
                self.gen as u32
            }
            fn without_gen(mut self) -> Self {
                self.gen = 0;
                self
            }
        }
    )*};
}

generational!(
    faults::FaultKey,
    stacks::StackKey,
    ffaults::FileKey,
    reclaim::ProcReclaimKey,
    generic::CountKey,
    ProcKey
);

crate::pod!(Filter, ProcEvent, ExecName, ProcKey, TaskOffsets);
