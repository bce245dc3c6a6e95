//! In-kernel DWARF unwinding (`--stack-mode dwarf` with tables): the user
//! stack is unwound here, frame by frame, with rows userspace compiled from
//! each file's `.eh_frame`, and stored like a frame-pointer walk's (same
//! scratch, ids and map), so nothing per event crosses the ring buffer.
// Unused in the compat build: the compat object keeps the tables' upkeep at fork and exit, not the unwinder.
#![cfg_attr(feature = "compat", allow(dead_code, unused_imports))]

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    cty::c_void,
    helpers::generated::bpf_loop,
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use memtrace_common::{
    kunwind::{mark, row, stat, UnwindProc},
    loss, stack_mode,
    stacks::MAX_UFRAMES,
};

use super::{
    emit::{count_loss, emit},
    filter::{current_tgid, FILTER},
    python::{drop_python, inherit_python, is_python},
    reads::{stack_top, user_regs},
    stacks::USTACK,
    unwind_copy::Copy,
    unwind_memo,
    unwind_rows::{le, row_for},
    unwind_vma::{forget_found, inherit_found, row_by_vma},
    walk::{WalkScratch, WALK_SCRATCH},
    NO_PREALLOC,
};

/// Per process, its executable mappings and their slices of the rows.
#[map]
static UNWIND_PROCS: HashMap<u32, UnwindProc> = HashMap::with_max_entries(1, NO_PREALLOC);

/// Processes whose pc was in no mapping memtrace knows: their maps are read
/// again, and the entry removed once done (one record until then).
#[map]
static UNWIND_MISSES: HashMap<u32, u8> = HashMap::with_max_entries(1, NO_PREALLOC);

/// How each unwind ended (`kunwind::stat`).
#[map]
static UNWIND_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::NR, 0);

/// A forked child runs its parent's code at its parent's addresses: it
/// starts with its parent's table, in place before its first event
/// (userspace reads its maps only when the fork's record arrives).
#[inline(always)]
pub(super) fn inherit_table(parent: u32, child: u32) {
    if let Some(p) = unsafe { UNWIND_PROCS.get(&parent) } {
        // Full: the child's stacks end "no table" and it is read as missed.
        let _ = UNWIND_PROCS.insert(&child, p, 0);
    }
    inherit_found(parent, child);
    inherit_python(parent, child);
}

/// A process that exec'd runs a new image: the old table would unwind its
/// code wrongly. None until userspace has read the new maps (the first
/// stack without one asks for it). Also at every thread's exit: a process
/// gone (or a thread a fork entered by its tid) holds no entry.
#[inline(always)]
pub(super) fn drop_table(tgid: u32) {
    let _ = UNWIND_PROCS.remove(&tgid);
    forget_found(tgid);
    drop_python(tgid);
}

#[inline(always)]
fn count(what: u32) {
    if let Some(p) = UNWIND_STATS.get_ptr_mut(what) {
        unsafe { *p += 1 };
    }
}

/// `unwind_user_stack` as a global BPF function: the verifier checks it
/// once, on its own, not once per path of every program that calls it.
/// Returns the stack id in the high half, the hash bits in the low.
#[cfg(not(feature = "compat"))]
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn memtrace_unwind_user_stack() -> u64 {
    // Kernels before about 6.8 verify a global function even where no call
    // reaches it, with this run's constants: without the unwinder its
    // offsets are unset, and the rest is dead code only behind this test.
    if FILTER.load().stacks & stack_mode::KUNWIND == 0 {
        return (u32::MAX as u64) << 32;
    }
    let (id, check) = unwind_user_stack();
    ((id as u32 as u64) << 32) | check as u64
}

/// What the frame loop reads: fixed for the whole unwind, on the caller's
/// stack.
#[repr(C)]
struct Walk {
    s: *mut WalkScratch,
    proc_: *const UnwindProc,
    copy: Copy,
}

/// What the frame loop changes, kept in map memory: the verifier does not
/// track its values, so it checks one frame's step once rather than once
/// per frame and per value (which took it about a second per program).
#[repr(C)]
pub struct Step {
    ip: u64,
    sp: u64,
    bp: u64,
    nr: u64,
    end: u64,
    /// `ip` is where the thread was (the first frame, or one a signal
    /// interrupted), not a return address.
    exact: u64,
    /// Some frame was walked by frame pointers: its code had no table yet.
    pending: u64,
    /// Some frame's code was in no table of the process.
    miss: u64,
    /// The process (here, not in `Walk`: the unwinder's stack has no
    /// room to spare on 6.1, see `next`).
    tgid: u64,
    /// Where `bp` was read from, until the unwind depends on its value (a
    /// frame's CFA from it, or a test of it): then the read is recorded for
    /// the memo. Most saved rbps are never used (code without frame
    /// pointers keeps data there: a request's pointer in a server), and a
    /// memo that held them would hold for that one request only.
    bp_at: u64,
}

impl Step {
    /// On to the caller's frame, in place: a new Step built and copied took
    /// 64 bytes of the frame step's stack, where a kernel before about 6.13
    /// allows 512 for the whole chain of calls (program, unwinder, step,
    /// the mapping lookup's callback).
    #[inline(always)]
    fn next(&mut self, ip: u64, sp: u64, bp: u64, i: usize, exact: u64) {
        self.ip = ip;
        self.sp = sp;
        self.bp = bp;
        self.nr = i as u64 + 1;
        self.end = mark::TRUNCATED;
        self.exact = exact;
    }
}

#[map]
static UNWIND_STEP: PerCpuArray<Step> = PerCpuArray::with_max_entries(1, 0);

/// One frame: from `ip`/`sp`/`bp` to its caller's. Returns 1 to stop, with
/// `end` set (0 when the stack is complete).
#[inline(never)]
extern "C" fn unwind_frame(index: u32, ctx: *mut c_void) -> i64 {
    let w = unsafe { &*(ctx as *const Walk) };
    let Some(st) = UNWIND_STEP.get_ptr_mut(0) else {
        return 1;
    };
    let (st, f) = unsafe { (&mut *st, &mut (*w.s).frames) };
    let stop = |st: &mut Step, end: u64| {
        st.end = end;
        1
    };
    let i = (index as usize + 1) & (MAX_UFRAMES - 1);
    let (ip, sp, mut bp) = (st.ip, st.sp, st.bp);
    // A return address is just past its call: look up the call itself (a
    // call can be a function's last instruction).
    let pc = if st.exact != 0 { ip } else { ip - 1 };
    let found = match unsafe { w.proc_.as_ref() } {
        Some(p) => row_for(p, st.tgid as u32, pc),
        None => Err(mark::NO_TABLE),
    };
    // Not in the process's table (yet): its file's rows by identity, and
    // the process's maps are read so that it gets a table.
    let found = match found {
        Err(mark::NO_TABLE) => {
            st.miss = 1;
            row_by_vma(st.tgid as u32, pc)
        }
        r => r,
    };
    let r = match found {
        Ok(r) => r,
        // Tables not ready (a process or library not read yet): its frame
        // pointers, rather than no stack at all.
        Err(mark::NO_TABLE) => {
            bp_used(st);
            return fp_frame(w, st, i);
        }
        // The outermost frame without unwind information (ld.so's entry
        // has none): a zero rbp marks it, as the ABI has it.
        Err(mark::NO_INFO) if bp_used(st) == 0 => return stop(st, 0),
        Err(e) => return stop(st, e),
    };
    let cfa = match r.kind {
        row::RSP => sp.wrapping_add(r.cfa_off as i64 as u64),
        // A zero rbp where the CFA is rbp's: the outermost frame (a Go
        // goroutine's first, walked by frame pointers), as the ABI has it.
        row::RBP => match bp_used(st) {
            0 => return stop(st, 0),
            b => b.wrapping_add(r.cfa_off as i64 as u64),
        },
        row::PLT => sp + 8 + (le(r.cfa_off as u64, ip & 15) << 3),
        row::END => return stop(st, 0),
        row::SWITCH => return stop(st, mark::SWITCH),
        row::SIGNAL => {
            return signal_frame(
                w,
                st,
                i,
                sp.wrapping_add(r.cfa_off as i64 as u64),
                r.rbp_off,
            )
        }
        // Information the rows cannot express: never taken for the end.
        row::UNSUPPORTED => return stop(st, mark::UNSUPPORTED),
        // Between functions with unwind information: ld.so's entry, unless
        // rbp is still the zero it starts with.
        _ if bp_used(st) == 0 => return stop(st, 0),
        _ => return stop(st, mark::NO_INFO),
    };
    let Some(ra) = w.copy.word(cfa.wrapping_sub(8)) else {
        return stop(st, mark::READ_FAIL);
    };
    if r.rbp_off != 0 {
        let at = cfa.wrapping_add((r.rbp_off as i64 * 8) as u64);
        match w.copy.peek(at) {
            Some(v) => {
                bp = v;
                st.bp_at = at;
            }
            None => return stop(st, mark::READ_FAIL),
        }
    }
    // The end of the stack, or a frame that does not go up it.
    if ra == 0 || cfa <= sp {
        return stop(st, 0);
    }
    f.ips[i] = ra;
    st.next(ra, cfa, bp, i, 0);
    0
}

/// `bp`, now that the unwind depends on it: the read it came from (if one)
/// is recorded for the memo.
#[inline(always)]
fn bp_used(st: &mut Step) -> u64 {
    if st.bp_at != 0 {
        unwind_memo::record(st.bp_at, st.bp);
        st.bp_at = 0;
    }
    st.bp
}

/// One frame by frame pointers, where the code has no table yet: the frame
/// record [saved rbp, return address] at rbp, above sp. Stops (the stack
/// marked as walked so) where there is no such record.
#[inline(always)]
fn fp_frame(w: &Walk, st: &mut Step, i: usize) -> i64 {
    st.pending = 1;
    st.end = mark::NO_TABLE;
    let (sp, bp) = (st.sp, st.bp);
    if bp & 7 != 0 || bp < sp {
        return 1;
    }
    // One word at a time: a pair of Options left an unset register that
    // the verifier refused to see stored.
    let Some(ra) = w.copy.word(bp.wrapping_add(8)) else {
        return 1;
    };
    if ra == 0 {
        return 1;
    }
    let Some(next) = w.copy.word(bp) else {
        return 1;
    };
    unsafe { (*w.s).frames.ips[i] = ra };
    st.next(ra, bp + 16, next, i, 0);
    0
}

/// Out of a signal handler: the interrupted registers, from the signal
/// frame at `sp` (`row::SIGNAL`): `at` holds the old sp, then the old ip.
/// The old sp need not be above this one (a handler on its own stack).
#[inline(always)]
fn signal_frame(w: &Walk, st: &mut Step, i: usize, at: u64, rbp_off: i8) -> i64 {
    let (Some(sp), Some(ip), Some(bp)) = (
        w.copy.word(at),
        w.copy.word(at.wrapping_add(8)),
        w.copy.word(st.sp.wrapping_add((rbp_off as i64 * 8) as u64)),
    ) else {
        st.end = mark::READ_FAIL;
        return 1;
    };
    if ip == 0 {
        st.end = 0;
        return 1;
    }
    unsafe { (*w.s).frames.ips[i] = ip };
    st.next(ip, sp, bp, i, 1);
    // Its bp was read (and recorded) from the signal frame.
    st.bp_at = 0;
    0
}

/// Unwinds the current task's user stack into the walk's scratch, ending
/// with a `mark` frame when it stops early. Returns its id and more bits of
/// its hash, as `walk_user_stack`.
#[inline(always)]
fn unwind_user_stack() -> (i32, u32) {
    let cfg = USTACK.load();
    let (Some(s), Some(step)) = (WALK_SCRATCH.get_ptr_mut(0), UNWIND_STEP.get_ptr_mut(0)) else {
        return (-1, 0);
    };
    let (ip, sp, bp) = user_regs(&cfg);
    let copy = Copy::take(unsafe { (*s).stack.as_mut_ptr() }, sp, stack_top(&cfg));
    let tgid = current_tgid();
    // One native stack runs many Python ones: a Python process's unwinds
    // are not memoized.
    let py = is_python(tgid);
    let r = if py {
        unwind_memo::NO_RECALL
    } else {
        unwind_memo::recall(tgid, ip, sp, bp, copy.len)
    };
    if r != unwind_memo::NO_RECALL {
        count(stat::COMPLETE);
        count(stat::REPEATED);
        return ((r >> 32) as u32 as i32, r as u32);
    }
    unwind_memo::begin(tgid, ip, sp, bp);
    unsafe {
        (*s).frames.ips[0] = ip;
        *step = Step {
            ip,
            sp,
            bp,
            nr: 1,
            end: mark::TRUNCATED,
            exact: 1,
            pending: 0,
            miss: 0,
            tgid: tgid as u64,
            bp_at: 0,
        };
    }
    let mut w = Walk {
        s,
        proc_: unsafe { UNWIND_PROCS.get(&tgid) }.map_or(core::ptr::null(), |p| p as *const _),
        copy,
    };
    // bpf_loop: the verifier checks the step as one function, not once per
    // frame. Frames 1.. are the loop's.
    unsafe {
        bpf_loop(
            MAX_UFRAMES as u32 - 1,
            unwind_frame as *mut c_void,
            &mut w as *mut Walk as *mut c_void,
            0,
        )
    };
    let f = unsafe { &mut (*s).frames };
    let (mut nr, mut end, pending, miss) = unsafe {
        let st = &*step;
        (st.nr as usize, st.end, st.pending != 0, st.miss != 0)
    };
    // Its maps are read (again): one record until they are.
    if miss && UNWIND_MISSES.insert(&tgid, &1, BPF_NOEXIST as u64).is_ok() {
        emit(&memtrace_common::kunwind::UnwindMiss {
            kind: memtrace_common::kind::UNWIND_MISS,
            tgid,
        });
    }
    if pending {
        count_loss(loss::TABLES_PENDING);
        // Whole as far as frame pointers tell: said so at its end.
        if end == 0 {
            end = mark::NO_TABLE;
        }
    }
    let (what, end) = match end {
        0 => (stat::COMPLETE, 0),
        mark::TRUNCATED => (stat::TRUNCATED, mark::TRUNCATED),
        mark::NO_TABLE => (stat::NO_TABLE, mark::NO_TABLE),
        mark::READ_FAIL => (stat::READ_FAIL, mark::READ_FAIL),
        mark::UNSUPPORTED => (stat::UNSUPPORTED, mark::UNSUPPORTED),
        mark::SWITCH => (stat::SWITCHED, mark::SWITCH),
        _ => (stat::NO_INFO, mark::NO_INFO),
    };
    count(what);
    if end != 0 {
        // In the last slot when the stack fills them all.
        let at = if nr >= MAX_UFRAMES {
            MAX_UFRAMES - 1
        } else {
            nr
        };
        f.ips[at] = end;
        nr = at + 1;
        if end == mark::TRUNCATED {
            count_loss(loss::STACK_TRUNCATED);
        }
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for i in 0..MAX_UFRAMES {
        if i >= nr {
            break;
        }
        h = (h ^ f.ips[i]).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ nr as u64).wrapping_mul(0x0000_0100_0000_01b3);
    f.hash = h;
    f.nr = nr as u32;
    let (id, check) = memtrace_common::stacks::ustack_id(h);
    // Complete, from tables alone: the next unwind from here may reuse it.
    if end == 0 && !pending && !miss && !py {
        unwind_memo::keep(memtrace_common::stacks::ustack_key(id, check));
    }
    (id, check)
}
