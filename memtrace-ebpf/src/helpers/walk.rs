//! The user frame-pointer walk (`--stack-mode fp`'s own walker): one copy of
//! the top of the user stack, a bounded walk over it, and the stack stored
//! under an id taken from its hash.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    cty::c_void,
    helpers::generated::{bpf_loop, bpf_probe_read_user},
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use memtrace_common::{
    loss,
    stacks::{ustack_id, ustack_key, UserStack, MAX_UFRAMES},
};

use super::{
    emit::count_loss,
    reads::{stack_top, user_regs},
    stacks::USTACK,
};

/// Pages of user stack, from sp's up, the frame-pointer walk reads at most.
const PAGES: usize = 4;
pub(super) const WINDOW: usize = PAGES * 4096;

#[repr(C, align(8))]
pub struct WalkScratch {
    /// User pages from sp's up, indexed from the start of sp's page; room
    /// for a first read that starts part way into it, and for a record read
    /// at the very end.
    pub(super) stack: [u8; WINDOW + 4096 + 16],
    pub(super) frames: UserStack,
}

#[map]
pub(super) static WALK_SCRATCH: PerCpuArray<WalkScratch> = PerCpuArray::with_max_entries(1, 0);

/// User stacks of the walk, by id; sized by userspace when stacks are on.
#[map]
pub static USTACKS: HashMap<u64, UserStack> = HashMap::with_max_entries(8192, 0);

/// What the frame loop reads, fixed for the walk: on the caller's stack.
#[repr(C)]
#[cfg_attr(feature = "compat", allow(dead_code))]
struct FpWalk {
    s: *mut WalkScratch,
    step: *mut FpStep,
    sp: u64,
    top: u64,
    base: u64,
    in0: u64,
}

/// What the frame loop changes, in map memory, whose values the verifier
/// does not track (see `kunwind::Step`).
#[repr(C)]
pub struct FpStep {
    fp: u64,
    nr: u64,
    h: u64,
    /// Pages of the copy read so far, a bit each.
    valid: u64,
    /// The walk stopped at one of its bounds (frames kept, pages copied)
    /// with the chain still going: the stack lacks its outer frames.
    cut: u64,
}

#[map]
static FP_STEP: PerCpuArray<FpStep> = PerCpuArray::with_max_entries(1, 0);

/// One frame record: from `fp` to its caller's. Returns 1 to stop.
#[inline(never)]
#[cfg_attr(feature = "compat", allow(dead_code))]
extern "C" fn fp_frame(index: u32, ctx: *mut c_void) -> i64 {
    let w = unsafe { &*(ctx as *const FpWalk) };
    let (st, s) = unsafe { (&mut *w.step, &mut *w.s) };
    let i = (index as usize + 1) & (MAX_UFRAMES - 1);
    let fp = st.fp;
    // A frame record is [saved fp, return address] at fp, above sp.
    if fp & 7 != 0 || fp < w.sp || (w.top > w.sp && fp + 16 > w.top) {
        return 1;
    }
    let off = fp - w.base;
    let page = off >> 12;
    let last = (off + 15) >> 12;
    if last >= PAGES as u64 {
        st.cut = 1;
        return 1;
    }
    let need = (1u64 << page) | (1u64 << last);
    if st.valid & need != need {
        for p in [page, last] {
            if st.valid & (1 << p) == 0 {
                // Page 0 from sp: what is below it is not the stack.
                let p = p & (PAGES as u64 - 1);
                let at = if p == 0 { w.in0 } else { p * 4096 };
                let r = unsafe {
                    bpf_probe_read_user(
                        s.stack.as_mut_ptr().add(at as usize) as *mut c_void,
                        (4096 - (at & 4095)) as u32,
                        (w.base + at) as *const c_void,
                    )
                };
                if r != 0 {
                    return 1;
                }
                st.valid |= 1 << p;
            }
        }
    }
    let off = off as usize & (WINDOW - 1);
    // fp is 8-aligned and so is the buffer: whole-word loads (an unaligned
    // read is eight byte loads in BPF).
    let (next, ret) = unsafe {
        let p = s.stack.as_ptr().add(off) as *const u64;
        (p.read(), p.add(1).read())
    };
    if ret == 0 {
        return 1;
    }
    s.frames.ips[i] = ret;
    st.nr = i as u64 + 1;
    st.h = (st.h ^ ret).wrapping_mul(0x0000_0100_0000_01b3);
    // Frames only go up the stack: anything else is not a chain.
    if next <= fp {
        return 1;
    }
    st.fp = next;
    st.cut = (i == MAX_UFRAMES - 1) as u64;
    0
}

/// Walks the user frame-pointer chain over one copy of the top of the stack,
/// bounded so that no read faults (the kernel's own walker reads past the
/// chain's end, and that fault cost more than the rest of the capture), and
/// leaves the stack in this CPU's scratch, to be stored by
/// `store_user_stack`. Returns its id and more bits of its hash.
#[inline(always)]
#[cfg_attr(feature = "compat", allow(dead_code))]
pub(super) fn walk_user_stack() -> (i32, u32) {
    // Its frames go where the in-kernel unwinder's memo has its own.
    super::unwind_memo::forget();
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
    // Opaque, so that LLVM keeps this constant bound: it folded it into the
    // comparison above, between two registers, which verifiers before about
    // 6.8 do not bound a size by (6.1 refused the read).
    let first = core::hint::black_box(first);
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
    s.frames.ips[0] = ip;
    let Some(step) = FP_STEP.get_ptr_mut(0) else {
        return (-1, 0);
    };
    unsafe {
        *step = FpStep {
            fp: bp,
            nr: 1,
            h: 0xcbf2_9ce4_8422_2325 ^ ip,
            valid: valid as u64,
            cut: 0,
        }
    };
    let mut w = FpWalk {
        s: &mut *s,
        step,
        sp,
        top,
        base,
        in0,
    };
    // bpf_loop: the verifier checks one frame's step once, not once per
    // frame (750 ms of every start with stacks).
    unsafe {
        bpf_loop(
            MAX_UFRAMES as u32 - 1,
            fp_frame as *mut c_void,
            &mut w as *mut FpWalk as *mut c_void,
            0,
        )
    };
    let st = unsafe { &*step };
    let (nr, mut h) = (st.nr as u32, st.h);
    if st.cut != 0 {
        count_loss(loss::STACK_TRUNCATED);
    }
    h = (h ^ nr as u64).wrapping_mul(0x0000_0100_0000_01b3);
    s.frames.hash = h;
    s.frames.nr = nr;
    ustack_id(h)
}

/// Without bpf_loop (5.10): the kernel's walker fills the scratch's frames
/// (`bpf_get_stack`), and the stack is kept by its own hash like a walked
/// one, not in the kernel's stack map, whose buckets refuse a second stack
/// that hashes into one: with ASLR, a lost stack one run in some tens.
#[cfg(feature = "compat")]
#[inline(always)]
pub(super) fn kernel_walk_user_stack(ctx: *mut c_void) -> (i32, u32) {
    let Some(s) = WALK_SCRATCH.get_ptr_mut(0) else {
        return (-1, 0);
    };
    let f = unsafe { &mut (*s).frames };
    let bytes = unsafe {
        aya_ebpf::helpers::generated::bpf_get_stack(
            ctx,
            f.ips.as_mut_ptr() as *mut c_void,
            (MAX_UFRAMES * 8) as u32,
            aya_ebpf::bindings::BPF_F_USER_STACK as u64,
        )
    };
    if bytes <= 0 {
        count_loss(loss::STACK);
        return (-1, 0);
    }
    let nr = (bytes as u64 / 8) as u32;
    // The helper zeroes what it did not fill: every slot hashes, without a
    // branch on nr for the verifier to follow.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for i in 0..MAX_UFRAMES {
        h = (h ^ f.ips[i]).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ nr as u64).wrapping_mul(0x0000_0100_0000_01b3);
    f.hash = h;
    f.nr = nr;
    ustack_id(h)
}

/// Stores the stack the last walk on this CPU left in its scratch under
/// `id`, unless it is there already. False when another stack holds the id
/// or the map is full, both counted: the caller then counts the event
/// without its stack.
#[inline(always)]
pub(super) fn store_user_stack(id: i32, check: u32) -> bool {
    let Some(s) = WALK_SCRATCH.get_ptr(0) else {
        return false;
    };
    let f = unsafe { &(*s).frames };
    let key = ustack_key(id, check);
    // NOEXIST: of two CPUs storing one stack, the second finds the first's.
    // Twice: memtrace takes stored stacks out as they arrive, and may take
    // this one between the insert that found it and the lookup.
    for _ in 0..2 {
        if USTACKS.insert(key, f, BPF_NOEXIST as u64).is_ok() {
            return true;
        }
        if let Some(v) = unsafe { USTACKS.get(key) } {
            if v.hash == f.hash {
                return true;
            }
            break;
        }
    }
    count_loss(loss::STACK);
    false
}
