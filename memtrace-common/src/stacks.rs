//! Stack-keyed counters shared by the stack-counting tools (brkstack), and
//! the copied user stacks of `--stack-mode dwarf`.

use crate::TASK_COMM_LEN;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StackKey {
    pub tgid: u32,
    pub ustack: i32,
    pub kstack: i32,
    /// More bits of a walked user stack's hash: two stacks that share an
    /// id never share a key, so a count is never merged into another
    /// stack's (the id alone is checked only when a key is new).
    pub ustack_check: u32,
    /// The count generation (see `Generational`).
    pub gen: u32,
    /// 1: counted by processes forked from `tgid`'s image, not by `tgid`
    /// (see `ImageOffsets`); which ones, `StackMember` records say.
    pub forked: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct StackVal {
    pub count: u64,
    /// Bytes the heap grew by (brk).
    pub bytes: u64,
    pub comm: [u8; TASK_COMM_LEN],
    /// The process that counted here last on this CPU (see `StackMember`).
    pub last: u32,
    pub _pad: u32,
}

/// Where a process's image is, for keying counts by image: processes forked
/// from one exec, under one name, run the same code at the same addresses,
/// so their identical stacks are one key, under the eldest's pid (see
/// `StackMember`). `levels` 0: keyed by process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ImageOffsets {
    pub task_group_leader: u32,
    pub task_real_parent: u32,
    pub task_tgid: u32,
    pub task_comm: u32,
    pub task_mm: u32,
    pub mm_exe_file: u32,
    pub mm_mmap_base: u32,
    /// Ancestors looked at, at most.
    pub levels: u32,
}

/// Ancestors an image key looks through (a bounded loop).
pub const MAX_IMAGE_LEVELS: u32 = 8;

/// A forked process counted under its image's key (`owner`, the stack ids,
/// forked) for the first time on this CPU since another did: userspace
/// keeps the set of processes per key, so a row still says how many
/// processes took it while the kernel keeps one entry for all of them.
/// The owner's own counts are a key of their own and need no record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct StackMember {
    pub kind: u32,
    pub member: u32,
    pub owner: u32,
    pub ustack: i32,
    pub kstack: i32,
    pub _pad: u32,
}

/// Where user registers and the main thread's stack top are: what both the
/// frame-pointer walk over a stack copy and `--stack-mode dwarf` need.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UstackConfig {
    /// Bytes of user stack copied from the stack pointer up.
    pub stack_bytes: u32,
    /// Copy one event in this many on each CPU; 1 copies every event.
    pub sample_every: u32,
    /// `struct pt_regs` offsets of the instruction, stack and frame pointers.
    pub regs_ip: u32,
    pub regs_sp: u32,
    pub regs_bp: u32,
    /// `mm_struct.start_stack`: the main thread's stack top, not to copy past.
    pub mm_start_stack: u32,
    /// The link register's (arm64: x30, which holds the return address
    /// until a function saves it); x86-64 has none, and reads rbp again.
    pub regs_lr: u32,
    pub _pad: u32,
}

/// Header of a `kind::STACK_SAMPLE` record; `size` bytes of the user stack,
/// from `sp` up, follow it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct StackSample {
    pub kind: u32,
    pub tgid: u32,
    pub pid: u32,
    pub kstack: i32,
    /// The tool's value: bytes the heap grew by (brk), the fault address (faults).
    pub value: u64,
    /// The tool's tag: 1 for a fault taken in kernel mode.
    pub aux: u32,
    /// Stack bytes copied: fewer than asked where the stack ends sooner.
    pub size: u32,
    /// Bytes at the start of the copy left out, unread: the page at the
    /// stack pointer was not there yet (a fault on it as the stack grows).
    pub skip: u32,
    pub _pad: u32,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// arm64's link register (x86-64: the frame pointer again).
    pub lr: u64,
    pub comm: [u8; TASK_COMM_LEN],
}

pub const STACK_SAMPLE_HDR: usize = core::mem::size_of::<StackSample>();

/// A user stack id meaning: in the `kind::STACK_SAMPLE` record this thread
/// sent just before the record carrying it (`--stack-mode dwarf`).
pub const USTACK_IN_SAMPLE: i32 = -2;

/// A user stack id meaning: not copied, by `--sample`.
pub const USTACK_NOT_SAMPLED: i32 = -3;

/// A user stack id meaning: the counts of an exited process's stacks,
/// folded into one under memtrace's bound on kept counts.
pub const USTACK_FOLDED: i32 = -4;

/// A user stack id meaning: counted while the count map was full, by
/// process, without its stacks (faults' spill slots).
pub const USTACK_SPILLED: i32 = -5;

/// Most user frames a stack walked or unwound in the kernel keeps (a power
/// of two: indexes are masked with it).
pub const MAX_UFRAMES: usize = 128;

/// A user stack walked in the kernel, stored once under its key
/// (`ustack_key`); the hash is kept to tell a collision of keys.
/// A walked stack's key: the 31-bit id counts carry in their keys and the
/// 32-bit check beside it (both from the stack's hash). Stored under the id
/// alone, two of some thousands of stacks often shared one: the second was
/// lost, or took the first's place in memtrace's store.
#[inline(always)]
pub const fn ustack_key(id: i32, check: u32) -> u64 {
    ((id as u32 as u64) << 32) | check as u64
}

/// A walked stack's id and check, from its hash: every walker names its
/// stacks so.
#[inline(always)]
pub const fn ustack_id(hash: u64) -> (i32, u32) {
    (
        ((hash ^ (hash >> 32)) as u32 & 0x7fff_ffff) as i32,
        (hash >> 32) as u32,
    )
}

/// The id and check of a key (`ustack_key`).
#[inline(always)]
pub const fn ustack_key_parts(key: u64) -> (u32, u32) {
    ((key >> 32) as u32, key as u32)
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UserStack {
    pub hash: u64,
    pub nr: u32,
    pub _pad: u32,
    /// Innermost first; only the first `nr` are set.
    pub ips: [u64; MAX_UFRAMES],
}

crate::names! {
    maps {
        STACKS: u32 => (), OnDemand;
        USTACKS: u64 => UserStack, OnDemand;
        WALK_SCRATCH: () => (), Compiled;
        FP_STEP: () => (), Compiled;
        SAMPLE_SCRATCH: () => (), OnDemand;
        SAMPLE_TICK: u32 => u32, Compiled;
    }
    globals {
        IMAGE: ImageOffsets;
        USTACK: UstackConfig;
    }
    progs {}
}

crate::pod!(
    ImageOffsets,
    StackMember,
    UstackConfig,
    UserStack,
    StackKey,
    StackVal,
    StackSample
);
