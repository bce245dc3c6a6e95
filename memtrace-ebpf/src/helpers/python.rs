//! CPython's frames in user stacks: after the in-kernel unwinder has walked
//! a Python process's native frames, the thread's Python frame chain is
//! walked here (thread state, then each `_PyInterpreterFrame`) and written
//! after them (`memtrace_common::python::frame`); userspace puts each C
//! call's Python frames in place of its `_PyEval_EvalFrameDefault` frame.
//! Userspace publishes where each process's interpreter keeps them
//! (`PY_PROCS`) as it reads its maps.
// The compat object has no in-kernel unwinder to add to.
#![cfg_attr(feature = "compat", allow(dead_code, unused_imports))]

use aya_ebpf::{
    cty::c_void,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user, generated::bpf_loop},
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray},
};
use memtrace_common::{
    python::{frame, stat, PyProc, MAX_THREADS, NONE, OWNED_BY_CSTACK},
    stacks::MAX_UFRAMES,
};

use super::{walk::WALK_SCRATCH, NO_PREALLOC};

/// Per process, where its interpreter is (userspace fills it).
#[map]
static PY_PROCS: HashMap<u32, PyProc> = HashMap::with_max_entries(1, NO_PREALLOC);

/// Per thread, its Python thread state as last found (checked at each
/// use: a thread state freed and reused for another thread is not
/// believed).
#[map]
static PY_THREADS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(1, 0);

/// How each walk ended (`python::stat`).
#[map]
static PY_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::NR, 0);

/// What the frame loop changes (in map memory, as `kunwind::Step`).
#[repr(C)]
pub struct PyStep {
    frame: u64,
    nr: u64,
    /// The first slot of this walk's frames.
    first: u64,
    /// Why the walk stopped (`stat`), or `stat::NR` while it goes on.
    end: u64,
}

#[map]
static PY_STEP: PerCpuArray<PyStep> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn count(what: u32) {
    if let Some(p) = PY_STATS.get_ptr_mut(what) {
        unsafe { *p += 1 };
    }
}

#[inline(always)]
fn word(at: u64) -> Option<u64> {
    unsafe { bpf_probe_read_user(at as *const u64) }.ok()
}

#[inline(always)]
fn byte(at: u64) -> Option<u8> {
    unsafe { bpf_probe_read_user(at as *const u8) }.ok()
}

/// Whether `tgid` runs a CPython memtrace walks (its frames are added, and
/// its stacks are not memoized: the same native stack runs many Python
/// ones).
#[inline(always)]
pub(super) fn is_python(tgid: u32) -> bool {
    // A value read from the entry, not the pointer's test: LLVM otherwise
    // keeps the pointer and ORs it with other flags, which the verifier
    // refuses.
    unsafe { PY_PROCS.get(&tgid) }.map_or(0, |p| p.minor) != 0
}

/// A fork's child runs its parent's interpreter at the same addresses.
#[inline(always)]
pub(super) fn inherit_python(parent: u32, child: u32) {
    if let Some(p) = unsafe { PY_PROCS.get(&parent) } {
        let _ = PY_PROCS.insert(&child, p, 0);
    }
}

/// Its image changed (exec) or it is gone.
#[inline(always)]
pub(super) fn drop_python(tgid: u32) {
    let _ = PY_PROCS.remove(&tgid);
}

/// The thread-list walk's state, on the caller's stack.
#[repr(C)]
struct Threads {
    ts: u64,
    tid: u64,
    next: u64,
    tid_at: u64,
    found: u64,
}

extern "C" fn thread_step(_i: u32, ctx: *mut c_void) -> i64 {
    let t = unsafe { &mut *(ctx as *mut Threads) };
    if t.ts == 0 {
        return 1;
    }
    if word(t.ts + t.tid_at) == Some(t.tid) {
        t.found = t.ts;
        return 1;
    }
    match word(t.ts + t.next) {
        Some(n) => {
            t.ts = n;
            0
        }
        None => 1,
    }
}

/// The thread state of thread `tid`, or 0.
#[inline(always)]
fn thread_state(py: &PyProc, tid: u32) -> u64 {
    let tid_at = py.ts_tid as u64;
    if let Some(&ts) = unsafe { PY_THREADS.get(&tid) } {
        if word(ts + tid_at) == Some(tid as u64) {
            return ts;
        }
    }
    let Some(interp) = word(py.runtime + py.interp_main as u64) else {
        return 0;
    };
    let Some(head) = word(interp + py.interp_threads as u64) else {
        return 0;
    };
    let mut t = Threads {
        ts: head,
        tid: tid as u64,
        next: py.ts_next as u64,
        tid_at,
        found: 0,
    };
    unsafe {
        bpf_loop(
            MAX_THREADS,
            thread_step as *mut c_void,
            &mut t as *mut Threads as *mut c_void,
            0,
        )
    };
    if t.found != 0 {
        let _ = PY_THREADS.insert(&tid, &t.found, 0);
    }
    t.found
}

/// What the frame loop reads, fixed for the walk.
#[repr(C)]
struct Walk {
    py: *const PyProc,
}

/// One Python frame: written at `nr` unless it is a C call's entry frame
/// (which marks the frame before it as its call's outermost). Returns 1 to
/// stop, with `end` set.
#[inline(never)]
extern "C" fn frame_step(_i: u32, ctx: *mut c_void) -> i64 {
    let w = unsafe { &*(ctx as *const Walk) };
    let (Some(st), Some(s)) = (PY_STEP.get_ptr_mut(0), WALK_SCRATCH.get_ptr_mut(0)) else {
        return 1;
    };
    let (st, f, py) = unsafe { (&mut *st, &mut (*s).frames, &*w.py) };
    let fr = st.frame;
    if fr == 0 {
        st.end = stat::WALKED as u64;
        return 1;
    }
    let nr = st.nr as usize;
    let (Some(code), Some(prev), Some(instr), Some(owner)) = (
        word(fr + py.f_code as u64),
        word(fr + py.f_previous as u64),
        word(fr + py.f_instr as u64),
        byte(fr + py.f_owner as u64),
    ) else {
        st.end = stat::READ_FAIL as u64;
        return 1;
    };
    st.frame = prev;
    let entry = if py.f_entry == NONE {
        if owner == OWNED_BY_CSTACK {
            // The C call's own frame: the one before was its outermost.
            if nr > st.first as usize {
                f.ips[(nr - 1) & (MAX_UFRAMES - 1)] |= frame::ENTRY;
            }
            return 0;
        }
        false
    } else {
        match byte(fr + py.f_entry as u64) {
            Some(e) => e != 0,
            None => {
                st.end = stat::READ_FAIL as u64;
                return 1;
            }
        }
    };
    if code == 0 {
        return 0;
    }
    if nr >= MAX_UFRAMES {
        st.end = stat::TRUNCATED as u64;
        return 1;
    }
    let units = instr.wrapping_sub(code) / 2;
    let units = if instr >= code && units < frame::NO_INSTR {
        units
    } else {
        frame::NO_INSTR
    };
    f.ips[nr & (MAX_UFRAMES - 1)] = frame::encode(code, units, entry);
    st.nr = nr as u64 + 1;
    0
}

/// Adds the current thread's Python frames to the stack the unwinder
/// left in the walk's scratch (native frames and end mark), and hashes it
/// again: its id in the high half and more bits of its hash in the low, as
/// `memtrace_unwind_user_stack`; all ones when nothing was added. A global
/// function: the verifier checks it on its own.
#[cfg(not(feature = "compat"))]
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn memtrace_python_frames(tgid: u32) -> u64 {
    let Some(py) = (unsafe { PY_PROCS.get(&tgid) }) else {
        return u64::MAX;
    };
    let (Some(st), Some(s)) = (PY_STEP.get_ptr_mut(0), WALK_SCRATCH.get_ptr_mut(0)) else {
        return u64::MAX;
    };
    let nr = unsafe { (*s).frames.nr } as usize;
    // Room for the BEGIN word and a frame at least.
    if nr + 2 > MAX_UFRAMES {
        count(stat::TRUNCATED);
        return u64::MAX;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    let ts = thread_state(py, tid);
    if ts == 0 {
        count(stat::NO_THREAD);
        return u64::MAX;
    }
    let Some(mut fr) = word(ts + py.ts_frame as u64) else {
        count(stat::READ_FAIL);
        return u64::MAX;
    };
    if py.cframe_frame != NONE && fr != 0 {
        match word(fr + py.cframe_frame as u64) {
            Some(v) => fr = v,
            None => {
                count(stat::READ_FAIL);
                return u64::MAX;
            }
        }
    }
    if fr == 0 {
        count(stat::NO_FRAME);
        return u64::MAX;
    }
    unsafe {
        (*s).frames.ips[nr & (MAX_UFRAMES - 1)] = frame::begin(py.minor, tgid);
        *st = PyStep {
            frame: fr,
            nr: nr as u64 + 1,
            first: nr as u64 + 1,
            end: stat::NR as u64,
        };
    }
    let mut w = Walk { py };
    unsafe {
        bpf_loop(
            MAX_UFRAMES as u32,
            frame_step as *mut c_void,
            &mut w as *mut Walk as *mut c_void,
            0,
        )
    };
    let (got, end) = unsafe { ((*st).nr as usize, (*st).end) };
    // Only the BEGIN word: nothing to add.
    if got <= nr + 1 {
        count(match end as u32 {
            stat::READ_FAIL => stat::READ_FAIL,
            _ => stat::NO_FRAME,
        });
        return u64::MAX;
    }
    count(match end as u32 {
        stat::NR => stat::TRUNCATED,
        e => e,
    });
    let f = unsafe { &mut (*s).frames };
    // The unwinder's hash, over every word now.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for i in 0..MAX_UFRAMES {
        if i >= got {
            break;
        }
        h = (h ^ f.ips[i]).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ got as u64).wrapping_mul(0x0000_0100_0000_01b3);
    f.hash = h;
    f.nr = got as u32;
    let (id, check) = memtrace_common::stacks::ustack_id(h);
    memtrace_common::stacks::ustack_key(id, check | 1)
}

/// The compat object has no in-kernel unwinder, whose stacks this adds to.
#[cfg(feature = "compat")]
#[inline(always)]
pub fn memtrace_python_frames(_tgid: u32) -> u64 {
    u64::MAX
}
