//! Mechanisms every tool shares: process filter, loss counters, ring buffer,
//! stack capture, and reads at offsets resolved by userspace.

use aya_ebpf::{
    bindings::{BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    cty::c_void,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel,
        generated::{
            bpf_get_current_task_btf, bpf_probe_read_kernel as bpf_probe_read_kernel_raw,
            bpf_probe_read_user, bpf_task_pt_regs,
        },
    },
    macros::{map, raw_tracepoint, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf, StackTrace},
    programs::{tracing::StackIdContext, RawTracePointContext, TracePointContext},
    EbpfContext, Global,
};
use memtrace_common::{
    kind, loss,
    snoop::{failed, FdFileOffsets, PendingCall, SyscallEvent, MAX_ARGS},
    stack_mode,
    stacks::{
        StackSample, UserStack, UstackConfig, MAX_UFRAMES, STACK_SAMPLE_HDR, USTACK_IN_SAMPLE,
        USTACK_NOT_SAMPLED,
    },
    Filter, TaskOffsets, TASK_COMM_LEN,
};

#[unsafe(no_mangle)]
pub static FILTER: Global<Filter> = Global::new(Filter {
    tgid: 0,
    children: 0,
    stacks: 0,
    fork_child_pid: 0,
});

#[unsafe(no_mangle)]
pub static TASK: Global<TaskOffsets> = Global::new(TaskOffsets {
    pid: 0,
    tgid: 0,
    comm: 0,
    mm: 0,
    cgroups: 0,
    css_set_subsys: 0,
    memory_cgrp_id: 0,
    css_cgroup: 0,
    cgroup_kn: 0,
    kernfs_node_id: 0,
    mm_rss_stat: 0,
    mm_total_vm: 0,
    mm_brk: 0,
    rss_stride: 0,
    rss_count: 0,
    task_cred: 0,
    cred_uid: 0,
    task_signal: 0,
    signal_oom_score_adj: 0,
    page_kb: 4,
    valid: 0,
});

/// For maps filled lazily: a preallocated map costs start-up time and locked
/// memory for entries that are mostly never used.
pub const NO_PREALLOC: u32 = aya_ebpf::bindings::BPF_F_NO_PREALLOC as u32;

/// Per-event records; userspace sizes it per tool.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

#[map]
pub static LOSSES: PerCpuArray<u64> = PerCpuArray::with_max_entries(loss::NR, 0);

/// Userspace shrinks this for tools without stacks.
#[map]
pub static STACKS: StackTrace = StackTrace::with_max_entries(8192, 0);

/// Processes forked from the traced one (`--children`).
#[map]
pub static FOLLOWED: HashMap<u32, u8> = HashMap::with_max_entries(8192, NO_PREALLOC);

#[inline(always)]
pub fn count_loss(what: u32) {
    if let Some(p) = LOSSES.get_ptr_mut(what) {
        unsafe { *p += 1 };
    }
}

#[inline(always)]
pub fn current_tgid() -> u32 {
    (bpf_get_current_pid_tgid() >> 32) as u32
}

/// Whether events of process `tgid` are wanted.
#[inline(always)]
pub fn wanted(tgid: u32) -> bool {
    let f = FILTER.load();
    if f.tgid == 0 || f.tgid == tgid {
        return true;
    }
    f.children != 0 && unsafe { FOLLOWED.get(tgid) }.is_some()
}

/// Sends `rec` to userspace, counting it as lost when the buffer is full.
/// The reader is woken at once, even behind batched records: rare records
/// are acted on while their process is still there (its maps are read).
#[inline(always)]
pub fn emit<T>(rec: &T) {
    if EVENTS.output::<T>(rec, BPF_RB_FORCE_WAKEUP as u64).is_err() {
        count_loss(loss::RINGBUF);
    }
}

/// Streamed records wake the reader only once this many bytes wait (set by
/// userspace from the buffer's size); 0 wakes it as the kernel would.
#[unsafe(no_mangle)]
static WAKE_BYTES: Global<u64> = Global::new(0);

/// Wakeup flags for a streamed record. A wakeup is an interrupt (microseconds
/// in a VM) and a reader that keeps up is woken for nearly every record, so
/// they are batched; memtrace also drains on a short timer.
#[inline(always)]
pub fn batched_wakeup() -> u64 {
    let wake = WAKE_BYTES.load();
    if wake == 0 {
        0
    } else if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= wake {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// `emit` for high-rate records, with batched wakeups.
#[inline(always)]
pub fn emit_streamed<T>(rec: &T) {
    if EVENTS.output::<T>(rec, batched_wakeup()).is_err() {
        count_loss(loss::RINGBUF);
    }
}

/// Set while this CPU captures a stack: the walk itself can fault (reading
/// user memory), and those faults are memtrace's, not the workload's.
#[map]
pub static BUSY: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
pub fn capturing() -> bool {
    BUSY.get(0).is_some_and(|b| *b != 0)
}

#[inline(always)]
fn set_busy(v: u32) {
    if let Some(p) = BUSY.get_ptr_mut(0) {
        unsafe { *p = v };
    }
}

#[unsafe(no_mangle)]
pub static USTACK: Global<UstackConfig> = Global::new(UstackConfig {
    stack_bytes: 0,
    sample_every: 1,
    regs_ip: 0,
    regs_sp: 0,
    regs_bp: 0,
    mm_start_stack: 0,
    _pad: [0; 2],
});

/// Events seen on this CPU since the last stack copy (`--sample`).
#[map]
static SAMPLE_TICK: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// `--stack-mode dwarf`: sends the user registers and the top of the user
/// stack (one event in `sample_every`), for userspace to unwind with the
/// binaries' .eh_frame. The tool's `value` and `aux` ride along. Returns the
/// user stack id for the tool's record (the caller holds BUSY: faults of the
/// copy are ours).
#[inline(always)]
fn sample_user_stack(kstack: i32, value: u64, aux: u32) -> i32 {
    let cfg = USTACK.load();
    if let Some(t) = SAMPLE_TICK.get_ptr_mut(0) {
        unsafe {
            *t += 1;
            if *t < cfg.sample_every {
                return USTACK_NOT_SAMPLED;
            }
            *t = 0;
        }
    }
    // A constant to the verifier: .rodata is frozen before programs load.
    let size = cfg.stack_bytes as u64;
    // Copied here first and sent at the size actually copied: a reserved
    // record has a constant size, and most stacks are far shorter than
    // `size` (the ring holds several times more samples this way).
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let Some(scratch) = SAMPLE_SCRATCH.get_ptr_mut(cpu) else {
        count_loss(loss::STACK_COPY);
        return -1;
    };
    let base = scratch as *mut u8;
    let (ip, sp, bp) = user_regs(&cfg);
    // The main thread's stack ends at start_stack: copying past it can fail.
    let top = stack_top(&cfg);
    let mut want = size;
    if top > sp && top - sp < want {
        want = top - sp;
    }
    let mut got = 0u64;
    // A thread's stack may end sooner still: halve until the copy succeeds.
    for shift in 0..4 {
        let n = want >> shift;
        if n == 0 || n > size || n > MAX_STACK_COPY as u64 {
            break;
        }
        let r = unsafe {
            bpf_probe_read_user(
                base.add(STACK_SAMPLE_HDR) as *mut c_void,
                n as u32,
                sp as *const c_void,
            )
        };
        if r == 0 {
            got = n;
            break;
        }
    }
    if got == 0 {
        count_loss(loss::STACK_COPY);
    }
    let id = bpf_get_current_pid_tgid();
    let hdr = StackSample {
        kind: kind::STACK_SAMPLE,
        tgid: (id >> 32) as u32,
        pid: id as u32,
        kstack,
        value,
        aux,
        size: got as u32,
        ip,
        sp,
        bp,
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
    };
    unsafe { core::ptr::write_unaligned(base as *mut StackSample, hdr) };
    let mut len = STACK_SAMPLE_HDR as u64 + got;
    if len > (STACK_SAMPLE_HDR + MAX_STACK_COPY) as u64 {
        len = (STACK_SAMPLE_HDR + MAX_STACK_COPY) as u64;
    }
    let rec = unsafe { core::slice::from_raw_parts(base as *const u8, len as usize) };
    // A record of the tool's own that follows wakes the reader if it must.
    if EVENTS.output::<[u8]>(rec, batched_wakeup()).is_err() {
        count_loss(loss::RINGBUF);
        return -1;
    }
    USTACK_IN_SAMPLE
}

/// The largest stack copy (`--stack-size`'s bound).
const MAX_STACK_COPY: usize = 65536;

#[repr(C, align(8))]
pub struct SampleScratch {
    buf: [u8; STACK_SAMPLE_HDR + MAX_STACK_COPY],
}

/// Where a stack sample is put together, one slot per CPU (a per-CPU map's
/// values are limited to 32 KiB); userspace sizes it in dwarf mode.
#[map]
static SAMPLE_SCRATCH: Array<SampleScratch> = Array::with_max_entries(1, 0);

/// Pages of user stack, from sp's up, the frame-pointer walk reads at most.
const PAGES: usize = 4;
const WINDOW: usize = PAGES * 4096;

#[repr(C, align(8))]
pub struct WalkScratch {
    /// User pages from sp's up, indexed from the start of sp's page; room
    /// for a first read that starts part way into it, and for a record read
    /// at the very end.
    stack: [u8; WINDOW + 4096 + 16],
    frames: UserStack,
}

#[map]
static WALK_SCRATCH: PerCpuArray<WalkScratch> = PerCpuArray::with_max_entries(1, 0);

/// User stacks of the walk, by id; sized by userspace when stacks are on.
#[map]
pub static USTACKS: HashMap<u32, UserStack> = HashMap::with_max_entries(8192, 0);

/// Loads a `T` at `base + off` straight from kernel memory, without a
/// helper call. `base` must be a BTF-typed pointer (from a `_btf` helper or a
/// field loaded through one) and `off` a verifier constant (a frozen
/// `.rodata` global): the verifier checks the access against the kernel's
/// BTF, and a fault reads as zero.
#[inline(always)]
unsafe fn load<T: Copy>(base: *const u8, off: u32) -> T {
    unsafe { core::ptr::read_volatile(base.add(off as usize) as *const T) }
}

/// The current task's user ip, sp and bp, loaded from its saved registers
/// (each helper call costs tens of ns on a mitigated kernel: none here
/// but the two that find the registers).
#[inline(always)]
fn user_regs(cfg: &UstackConfig) -> (u64, u64, u64) {
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const u8;
    unsafe {
        (
            load::<u64>(regs, cfg.regs_ip),
            load::<u64>(regs, cfg.regs_sp),
            load::<u64>(regs, cfg.regs_bp),
        )
    }
}

/// The current task's `mm_struct`, BTF-typed (null for kernel threads).
#[inline(always)]
pub fn current_mm() -> *const u8 {
    unsafe { load::<*const u8>(bpf_get_current_task_btf() as *const u8, TASK.load().mm) }
}

/// A `u64` field of the current task's `mm_struct`; 0 for kernel threads.
#[inline(always)]
pub fn current_mm_u64(off: u32) -> u64 {
    let mm = current_mm();
    if mm.is_null() {
        return 0;
    }
    unsafe { load::<u64>(mm, off) }
}

/// The main thread's stack top (`mm->start_stack`): the copy stops there.
#[inline(always)]
fn stack_top(cfg: &UstackConfig) -> u64 {
    current_mm_u64(cfg.mm_start_stack)
}

/// Walks the user frame-pointer chain over one copy of the top of the stack,
/// bounded so that no read faults (the kernel's own walker reads past the
/// chain's end, and that fault cost more than the rest of the capture), and
/// leaves the stack in this CPU's scratch, to be stored by
/// `store_user_stack`. Returns its id and more bits of its hash.
#[inline(always)]
fn walk_user_stack() -> (i32, u32) {
    let cfg = USTACK.load();
    let Some(s) = WALK_SCRATCH.get_ptr_mut(0) else {
        return (-1, 0);
    };
    let s = unsafe { &mut *s };
    let (ip, sp, bp) = user_regs(&cfg);
    let top = stack_top(&cfg);
    let base = sp & !4095;
    let in0 = sp & 4095;
    // Page k of the copy is user page k above sp's.
    let buf = s.stack.as_mut_ptr();
    let mut valid: u32 = 0;
    // The main thread's stack is in use from sp to start_stack: one read
    // takes it all when it fits. Elsewhere, sp's page now and the pages
    // frame records are in as the walk reaches them (pages in between may
    // never have been touched, and reading one would fault).
    let whole = top.wrapping_sub(sp);
    let first = if top > sp && whole <= (WINDOW as u64 - in0) {
        whole
    } else {
        4096 - in0
    };
    if first <= WINDOW as u64
        && unsafe {
            bpf_probe_read_user(
                buf.add(in0 as usize) as *mut c_void,
                first as u32,
                sp as *const c_void,
            )
        } == 0
    {
        valid = (1u32 << ((in0 + first + 4095) >> 12)) - 1;
    }
    let f = &mut s.frames;
    f.ips[0] = ip;
    let mut nr = 1u32;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ ip;
    let mut fp = bp;
    for i in 1..MAX_UFRAMES {
        // A frame record is [saved fp, return address] at fp, above sp.
        if fp & 7 != 0 || fp < sp || (top > sp && fp + 16 > top) {
            break;
        }
        let off = fp - base;
        let page = off >> 12;
        let last = (off + 15) >> 12;
        if last >= PAGES as u64 {
            break;
        }
        let need = (1u32 << page) | (1u32 << last);
        if valid & need != need {
            let mut ok = true;
            for p in [page, last] {
                if valid & (1 << p) == 0 {
                    // Page 0 from sp: what is below it is not the stack.
                    let p = p & (PAGES as u64 - 1);
                    let at = if p == 0 { in0 } else { p * 4096 };
                    let r = unsafe {
                        bpf_probe_read_user(
                            buf.add(at as usize) as *mut c_void,
                            (4096 - (at & 4095)) as u32,
                            (base + at) as *const c_void,
                        )
                    };
                    if r != 0 {
                        ok = false;
                        break;
                    }
                    valid |= 1 << p;
                }
            }
            if !ok {
                break;
            }
        }
        let off = off as usize & (WINDOW - 1);
        // fp is 8-aligned and so is the buffer: whole-word loads (an
        // unaligned read is eight byte loads in BPF).
        let (next, ret) = unsafe {
            let p = s.stack.as_ptr().add(off) as *const u64;
            (p.read(), p.add(1).read())
        };
        if ret == 0 {
            break;
        }
        f.ips[i] = ret;
        nr = i as u32 + 1;
        h = (h ^ ret).wrapping_mul(0x0000_0100_0000_01b3);
        // Frames only go up the stack: anything else is not a chain.
        if next <= fp {
            break;
        }
        fp = next;
    }
    h = (h ^ nr as u64).wrapping_mul(0x0000_0100_0000_01b3);
    f.hash = h;
    f.nr = nr;
    (
        ((h ^ (h >> 32)) as u32 & 0x7fff_ffff) as i32,
        (h >> 32) as u32,
    )
}

/// Stores the stack the last walk on this CPU left in its scratch under
/// `id`, unless it is there already. False when another stack holds the id
/// or the map is full, both counted: the caller then counts the event
/// without its stack.
#[inline(always)]
fn store_user_stack(id: i32) -> bool {
    let Some(s) = WALK_SCRATCH.get_ptr(0) else {
        return false;
    };
    let f = unsafe { &(*s).frames };
    let id = id as u32;
    // NOEXIST: of two CPUs storing one id, the second finds the first's.
    if USTACKS.insert(id, f, BPF_NOEXIST as u64).is_ok() {
        return true;
    }
    if unsafe { USTACKS.get(id) }.is_some_and(|v| v.hash == f.hash) {
        return true;
    }
    count_loss(loss::STACK);
    false
}

/// A capture's stack ids. `user_check` holds more bits of a walked user
/// stack's hash, for keys that count by stack.
#[derive(Clone, Copy)]
pub struct Stacks {
    pub user: i32,
    pub kern: i32,
    pub user_check: u32,
}

impl Stacks {
    /// For counting tools, on a key their map does not have yet: stores the
    /// walked user stack, or drops it from the key when it cannot be
    /// stored (counted). Keys already in the map skip this, which saves a
    /// lookup per event.
    #[inline(always)]
    pub fn keep(&mut self) {
        if self.user >= 0 && self.user_check != 0 && !store_user_stack(self.user) {
            self.user = -1;
            self.user_check = 0;
        }
    }
}

/// Counting by stack in a per-CPU map: applies `bump` to `key`'s value and
/// returns true, or returns false when the caller must insert it. The walked
/// user stack is stored only when the key is new (`Stacks::keep`); if it
/// cannot be, the key loses its user stack (`set_user`) and is looked up
/// again. Per-CPU values: no other CPU writes the slot, so a plain add is
/// exact.
#[inline(always)]
pub fn bump_by_stack<K, V>(
    map: &PerCpuHashMap<K, V>,
    key: &mut K,
    st: &mut Stacks,
    set_user: impl Fn(&mut K, &Stacks),
    bump: impl Fn(&mut V),
) -> bool {
    if let Some(v) = map.get_ptr_mut(&*key) {
        bump(unsafe { &mut *v });
        return true;
    }
    let user = st.user;
    st.keep();
    if st.user != user {
        set_user(key, st);
        if let Some(v) = map.get_ptr_mut(&*key) {
            bump(unsafe { &mut *v });
            return true;
        }
    }
    false
}

/// Stack ids for the current task, as configured by `FILTER.stacks`; -1 when
/// not captured, and every failed capture is counted. In dwarf mode the user
/// stack goes out in a record of its own, with the tool's `value` and `aux`,
/// just before whatever the tool sends next (`USTACK_IN_SAMPLE`). A walked
/// user stack is not stored yet: counting tools call `Stacks::keep` when
/// their key is new, the others use `stack_ids`.
#[inline(always)]
pub fn capture_stacks<C: StackIdContext>(ctx: &C, value: u64, aux: u32) -> Stacks {
    let mode = FILTER.load().stacks;
    let mut st = Stacks {
        user: -1,
        kern: -1,
        user_check: 0,
    };
    if mode == 0 {
        return st;
    }
    set_busy(1);
    if mode & stack_mode::KERNEL != 0 {
        match ctx.get_stackid(&STACKS, 0) {
            Ok(id) => st.kern = id as i32,
            Err(_) => count_loss(loss::STACK),
        }
    }
    if mode & stack_mode::USER != 0 {
        if mode & stack_mode::WALK != 0 {
            (st.user, st.user_check) = walk_user_stack();
            // Never 0 for a walked stack: 0 means nothing to store.
            st.user_check |= 1;
        } else if mode & stack_mode::DWARF != 0 {
            st.user = sample_user_stack(st.kern, value, aux);
        } else {
            match ctx.get_stackid(&STACKS, aya_ebpf::bindings::BPF_F_USER_STACK as u64) {
                Ok(id) => st.user = id as i32,
                Err(_) => count_loss(loss::STACK),
            }
        }
    }
    set_busy(0);
    st
}

/// `capture_stacks` with the user stack stored: for tools that send each
/// event on.
#[inline(always)]
pub fn stack_ids<C: StackIdContext>(ctx: &C, value: u64, aux: u32) -> (i32, i32) {
    let mut st = capture_stacks(ctx, value, aux);
    st.keep();
    (st.user, st.kern)
}

/// Reads a `T` at `base + off` in kernel memory.
#[inline(always)]
pub unsafe fn read<T>(base: *const u8, off: u32) -> Result<T, i32> {
    unsafe { bpf_probe_read_kernel(base.add(off as usize) as *const T) }
}

#[inline(always)]
pub fn current_task() -> *const u8 {
    unsafe { bpf_get_current_task() as *const u8 }
}

/// Reads a `T` at `base + off` in kernel memory; zero when that fails (the
/// helper zeroes it). No branch on the outcome: a chain of reads whose
/// failures lead nowhere else is cheap for the verifier to check (branching
/// on each made oomkill's program take 14 ms to load).
#[inline(always)]
pub unsafe fn read0<T: Copy>(base: *const u8, off: u32) -> T {
    let mut v = core::mem::MaybeUninit::<T>::uninit();
    unsafe {
        bpf_probe_read_kernel_raw(
            v.as_mut_ptr() as *mut c_void,
            core::mem::size_of::<T>() as u32,
            base.add(off as usize) as *const c_void,
        );
        v.assume_init()
    }
}

/// Kernfs id of the cgroup of `task`'s memory controller: the inode number of
/// its directory in the memory hierarchy (v1) or the unified one (v2).
#[inline(always)]
pub unsafe fn memcg_id(task: *const u8) -> u64 {
    let t = TASK.load();
    if t.valid == 0 {
        return 0;
    }
    unsafe {
        let cset = read0::<*const u8>(task, t.cgroups);
        css_cgroup_id(read0::<*const u8>(
            cset,
            t.css_set_subsys + t.memory_cgrp_id * 8,
        ))
    }
}

/// Kernfs id of the cgroup a `cgroup_subsys_state` belongs to.
#[inline(always)]
pub unsafe fn css_cgroup_id(css: *const u8) -> u64 {
    let t = TASK.load();
    unsafe {
        let cgrp = read0::<*const u8>(css, t.css_cgroup);
        let kn = read0::<*const u8>(cgrp, t.cgroup_kn);
        read0::<u64>(kn, t.kernfs_node_id)
    }
}

/// `sched:sched_process_fork`: follow the children of traced processes.
#[tracepoint]
pub fn follow_fork(ctx: TracePointContext) -> u32 {
    let f = FILTER.load();
    let parent = current_tgid();
    if f.tgid == 0 || !(parent == f.tgid || unsafe { FOLLOWED.get(parent) }.is_some()) {
        return 0;
    }
    if let Ok(child) = unsafe { ctx.read_at::<u32>(f.fork_child_pid as usize) } {
        if FOLLOWED.insert(child, 1u8, 0).is_err() {
            count_loss(loss::MAP_FULL);
        }
    }
    let _ = ctx.as_ptr();
    0
}

/// The name each traced process took at its last exec. Counting tools keep
/// the name seen at a key's first event, and a forked child's first faults
/// come before its exec, under its parent's name. Sized by the tools that
/// use it; LRU: a name pushed out leaves the first-seen one.
#[map]
pub static EXEC_NAMES: LruHashMap<u32, [u8; TASK_COMM_LEN]> = LruHashMap::with_max_entries(1, 0);

/// `sched:sched_process_exec` (rare): remember the new name.
#[tracepoint]
pub fn name_exec(_ctx: TracePointContext) -> u32 {
    let tgid = current_tgid();
    if wanted(tgid) {
        if let Ok(comm) = bpf_get_current_comm() {
            let _ = EXEC_NAMES.insert(&tgid, &comm, 0);
        }
    }
    0
}

/// Empty programs, for `--floor`: what running any program on a tracepoint
/// costs, the floor the benchmarks measure the tools against.
#[tracepoint]
pub fn floor_tp(_ctx: TracePointContext) -> u32 {
    0
}

#[raw_tracepoint]
pub fn floor_raw(_ctx: RawTracePointContext) -> i32 {
    0
}

/// Calls between sys_enter and sys_exit, by thread id (mmapsnoop, shmsnoop):
/// the arguments are only in the enter tracepoint, the result only in the exit one.
#[map]
pub static SNOOP_PENDING: HashMap<u32, PendingCall> = HashMap::with_max_entries(4096, 0);

/// sys_enter of a snooped call: keeps its arguments, read at the offsets the
/// format file gave, until its sys_exit.
#[inline(always)]
pub fn syscall_enter(ctx: &TracePointContext, op: u32, offsets: &[u32], self_tgid: u32) {
    let tgid = current_tgid();
    if tgid == self_tgid || !wanted(tgid) {
        return;
    }
    let mut call = PendingCall {
        op,
        _pad: 0,
        args: [0; MAX_ARGS],
    };
    // zip, not indexing: no bounds check for the verifier to see.
    // The arguments are 8-byte fields in the record's first 64 bytes: one
    // read for all (each helper call costs tens of ns on a mitigated kernel).
    let Ok(words) = (unsafe { ctx.read_at::<[u64; 8]>(0) }) else {
        count_loss(loss::READ);
        return;
    };
    for (arg, off) in call.args.iter_mut().zip(offsets) {
        *arg = words[(*off as usize / 8) & 7];
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    if SNOOP_PENDING.insert(tid, call, 0).is_err() {
        count_loss(loss::MAP_FULL);
    }
}

/// sys_exit of a snooped call: one record with the arguments and the result.
/// Only threads whose entry was kept have an entry, so this filters by pid too.
#[inline(always)]
pub fn syscall_exit(
    ctx: &TracePointContext,
    kind: u32,
    op: u32,
    ret_off: u32,
    failed_only: u32,
    file_of: impl Fn(&PendingCall) -> (u32, u64),
) {
    let id = bpf_get_current_pid_tgid();
    let tid = id as u32;
    let call = match SNOOP_PENDING.get_ptr(tid) {
        Some(p) => unsafe { *p },
        None => return,
    };
    let _ = SNOOP_PENDING.remove(tid);
    // A different op: the entry of this call was missed (attached mid-call).
    if call.op != op {
        return;
    }
    let ret = match unsafe { ctx.read_at::<i64>(ret_off as usize) } {
        Ok(r) => r,
        Err(_) => {
            count_loss(loss::READ);
            return;
        }
    };
    if failed_only != 0 && !failed(op, call.args[0], ret) {
        return;
    }
    let (ustack, kstack) = stack_ids(ctx, 0, 0);
    let (file_dev, file_ino) = file_of(&call);
    let ev = SyscallEvent {
        kind,
        op,
        pid: (id >> 32) as u32,
        tid,
        ret,
        ts_ns: unsafe { bpf_ktime_get_ns() },
        args: call.args,
        ustack,
        kstack,
        file_dev,
        _pad: 0,
        file_ino,
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
    };
    emit_streamed(&ev);
}

/// Device and inode of the current task's file `fd`, or (0, 0).
#[inline(always)]
pub fn fd_file(o: &FdFileOffsets, fd: u64) -> (u32, u64) {
    let fd = fd as i32;
    if o.valid == 0 || fd < 0 {
        return (0, 0);
    }
    let r = unsafe {
        read::<*const u8>(current_task(), o.task_files).and_then(|files| {
            let fdt = read::<*const u8>(files, o.files_fdt)?;
            let max = read::<u32>(fdt, o.fdt_max_fds)?;
            if fd as u32 >= max {
                return Err(0);
            }
            let fds = read::<*const u8>(fdt, o.fdt_fd)?;
            let file = read::<*const u8>(fds, fd as u32 * 8)?;
            let inode = read::<*const u8>(file, o.file_inode)?;
            let ino = read::<u64>(inode, o.inode_ino)?;
            let sb = read::<*const u8>(inode, o.inode_sb)?;
            Ok((read::<u32>(sb, o.sb_dev)?, ino))
        })
    };
    match r {
        Ok(v) => v,
        Err(_) => {
            count_loss(loss::READ);
            (0, 0)
        }
    }
}
