//! User mode: the allocator's functions (uprobes placed by userspace) and
//! anonymous mmap/munmap outside it.

use aya_ebpf::{
    bindings::pt_regs,
    cty::c_void,
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user,
        generated::{bpf_get_attach_cookie, bpf_get_func_ip},
    },
    macros::{tracepoint, uprobe, uretprobe},
    programs::{tracing::StackIdContext, ProbeContext, RetProbeContext, TracePointContext},
    EbpfContext,
};
use memtrace_common::{
    loss,
    memleak::{counter, origin, shape, PendingAlloc},
};

use super::{
    admit, bump, pending, record, release, set_pending, tracked, MEMLEAK_CFG, ML_EXECS, USER,
};
use crate::helpers::{count_loss, current_tgid, in_watched_group, tp_field, wanted, Regs};

/// Whether process `tgid` (the current one) is traced: the filter's, or
/// for memcg --heap the watched groups' processes (uprobes or the shim).
#[inline(always)]
pub(super) fn traced(tgid: u32) -> bool {
    if MEMLEAK_CFG.load().by_group != 0 {
        return in_watched_group();
    }
    wanted(tgid)
}

const MAP_ANONYMOUS: u64 = 0x20;
/// glibc's smallest mmap threshold (DEFAULT_MMAP_THRESHOLD_MIN): a call this
/// big may map its block itself.
const MMAP_FLOOR: u64 = 128 * 1024;

#[inline(always)]
pub(super) fn free_user(tgid: u32, addr: u64) {
    if addr == 0 {
        return;
    }
    let c = MEMLEAK_CFG.load();
    let released = release(USER, tgid, addr, origin::USER);
    if !released && c.sample_bytes == 0 {
        bump(counter::FREE_UNKNOWN);
    }
    // A free on its own (a thread with no batch) while others queue
    // allocations: theirs may be of this block.
    #[cfg(not(feature = "compat"))]
    if c.shim_memo != 0 {
        let k = memtrace_common::memleak::AllocKey {
            addr,
            tgid,
            origin: origin::USER,
        };
        super::batched::freed_early(&k, unsafe { bpf_ktime_get_ns() });
    }
}

/// `x * y` for calloc-style requests. BPF has no 128-bit multiply, which
/// LLVM uses for any overflow check, so a factor of 4 GiB or more
/// saturates (such a request fails or is absurd anyway).
#[inline(always)]
fn mul(x: u64, y: u64) -> u64 {
    if x >> 32 == 0 && y >> 32 == 0 {
        x * y
    } else if x == 0 || y == 0 {
        0
    } else {
        u64::MAX
    }
}

/// An allocator's entry: the request, by the function's shape (the probe's
/// cookie), kept until its return. False when its return need not be seen:
/// a call inside a pending one, or one left out (`-z`/`-Z`, sampling) that
/// has no old block to release.
#[inline(always)]
fn alloc_enter(regs: *const pt_regs, shape: u64) -> bool {
    if !traced(current_tgid()) {
        return false;
    }
    let r = Regs(regs);
    let id = bpf_get_current_pid_tgid();
    let (size, ptr) = match shape {
        shape::CALLOC => (mul(r.arg(0), r.arg(1)), 0),
        shape::REALLOC => (r.arg(1), r.arg(0)),
        shape::REALLOCARRAY => (mul(r.arg(1), r.arg(2)), r.arg(0)),
        shape::ALIGNED => (r.arg(1), 0),
        shape::POSIX_MEMALIGN => (r.arg(2), r.arg(0)),
        shape::PVALLOC => {
            let p = MEMLEAK_CFG.load().page_size as u64;
            (r.arg(0).div_ceil(p.max(1)) * p, 0)
        }
        _ => (r.arg(0), 0),
    };
    let sp = r.sp();
    if let Some(outer) = pending(id) {
        if sp <= outer.call.sp {
            // Called by the allocator itself (at the same stack pointer: a
            // tail call, as glibc's realloc(NULL, n) jumps to malloc): part
            // of the outer call.
            return false;
        }
        // A call above the pending one: its return never came (longjmp).
        count_loss(loss::MISSED_RETURN);
    }
    let (n, bytes) = admit(size).unwrap_or((0, 0));
    // An old block that is not followed (most of them, when sampling) has
    // nothing to release: its return need not be seen. A call left out
    // that may map its block stays pending all the same, so that its mmap
    // is the allocator's, not one more allocation of the program's.
    let frees_old = matches!(shape, shape::REALLOC | shape::REALLOCARRAY)
        && ptr != 0
        && tracked(USER, (id >> 32) as u32, ptr, origin::USER);
    if n == 0 && !frees_old && size < MMAP_FLOOR {
        return false;
    }
    set_pending(
        id,
        PendingAlloc {
            size,
            ptr,
            shape,
            sp,
            n,
            bytes,
        },
    );
    true
}

/// An allocator's return: the block, recorded with the stack (its
/// innermost frame is the caller), and realloc's old block released.
#[inline(always)]
fn alloc_return<C: StackIdContext>(ctx: &C, regs: *const pt_regs) {
    let id = bpf_get_current_pid_tgid();
    let Some(slot) = pending(id) else {
        return;
    };
    let r = Regs(regs);
    // The return of an inner call (it was entered below the outer call):
    // the outer return records the allocation.
    if r.entry_sp() < slot.call.sp {
        return;
    }
    slot.id = 0;
    let p = slot.call;
    let tgid = (id >> 32) as u32;
    let ret = r.ret();
    let addr = match p.shape {
        shape::POSIX_MEMALIGN if ret == 0 => unsafe { bpf_probe_read_user(p.ptr as *const u64) }
            .unwrap_or_else(|_| {
                count_loss(loss::READ);
                0
            }),
        shape::POSIX_MEMALIGN => 0,
        _ => ret,
    };
    // The old block is gone once the new one is there (or asked to be
    // freed): not counted as unknown when not tracked, since glibc's
    // realloc(p, 0) frees it through free itself, first.
    if matches!(p.shape, shape::REALLOC | shape::REALLOCARRAY)
        && (addr != 0 || p.size == 0)
        && p.ptr != 0
    {
        release(USER, tgid, p.ptr, origin::USER);
    }
    if addr != 0 && p.n != 0 {
        record(ctx, USER, tgid, addr, p.size, origin::USER, (p.n, p.bytes));
    }
}

#[uprobe]
pub fn ml_alloc_enter(ctx: ProbeContext) -> u32 {
    let shape = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    alloc_enter(ctx.regs, shape);
    0
}

/// `ml_alloc_enter` for kernels without attach cookies (before 5.15): a
/// program per shape.
macro_rules! by_shape {
    ($($name:ident $shape:ident;)*) => {$(
        #[uprobe]
        pub fn $name(ctx: ProbeContext) -> u32 {
            alloc_enter(ctx.regs, shape::$shape);
            0
        }
    )*};
}

by_shape! {
    ml_enter_size SIZE;
    ml_enter_calloc CALLOC;
    ml_enter_realloc REALLOC;
    ml_enter_reallocarray REALLOCARRAY;
    ml_enter_aligned ALIGNED;
    ml_enter_posix_memalign POSIX_MEMALIGN;
    ml_enter_pvalloc PVALLOC;
}

#[uretprobe]
pub fn ml_alloc_return(ctx: RetProbeContext) -> u32 {
    alloc_return(&ctx, ctx.regs);
    0
}

/// Entry and return in one program (a uprobe session, Linux 6.13): at entry
/// the instruction pointer is the probed address (`bpf_get_func_ip`), at
/// the return it is the caller's. A non-zero result at entry tells the
/// kernel to skip this call's return probe: unsampled calls cost one trap.
/// Written without aya's `#[uprobe]`, which returns 0 whatever the body does.
#[unsafe(no_mangle)]
#[unsafe(link_section = "uprobe")]
pub fn ml_alloc_session(raw: *mut c_void) -> u32 {
    let ctx = ProbeContext::new(raw);
    if Regs(ctx.regs).ip() == unsafe { bpf_get_func_ip(raw) } {
        let shape = unsafe { bpf_get_attach_cookie(raw) };
        return if alloc_enter(ctx.regs, shape) { 0 } else { 1 };
    }
    alloc_return(&ctx, ctx.regs);
    0
}

#[uprobe]
pub fn ml_free(ctx: ProbeContext) -> u32 {
    let tgid = current_tgid();
    if traced(tgid) {
        free_user(tgid, ctx.arg::<u64>(0).unwrap_or(0));
    }
    0
}

/// An exec ends every call in flight in the old image: their returns never
/// come (a `-c` command's own exec starts inside one). The old image's
/// blocks are gone too: noted, for userspace to take them out; and the
/// shim's batch there (its address would read the new image's memory).
#[tracepoint]
pub fn ml_exec(_ctx: TracePointContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    if let Some(s) = pending(id) {
        s.id = 0;
    }
    super::preload::left_image(id as u32);
    let tgid = current_tgid();
    if traced(tgid)
        && ML_EXECS
            .insert(&tgid, &unsafe { bpf_ktime_get_ns() }, 0)
            .is_err()
    {
        count_loss(loss::MAP_FULL);
    }
    0
}

/// Anonymous mmap outside the allocator (whose own mmaps are its blocks).
#[tracepoint]
pub fn ml_mmap_enter(ctx: TracePointContext) -> u32 {
    if !traced(current_tgid()) {
        return 0;
    }
    let c = MEMLEAK_CFG.load();
    let flags: u64 = tp_field(&ctx, c.mmap_flags);
    let id = bpf_get_current_pid_tgid();
    if flags & MAP_ANONYMOUS == 0 || pending(id).is_some() {
        return 0;
    }
    set_pending(
        id,
        PendingAlloc {
            size: tp_field(&ctx, c.mmap_len),
            ptr: 0,
            shape: shape::MMAP,
            sp: 0,
            n: 0,
            bytes: 0,
        },
    );
    0
}

#[tracepoint]
pub fn ml_mmap_exit(ctx: TracePointContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let Some(slot) = pending(id) else {
        return 0;
    };
    if slot.call.shape != shape::MMAP {
        return 0;
    }
    slot.id = 0;
    let p = slot.call;
    let ret: i64 = tp_field(&ctx, MEMLEAK_CFG.load().sys_ret);
    if ret <= 0 && ret > -4096 {
        return 0;
    }
    if let Some(w) = admit(p.size) {
        record(
            &ctx,
            USER,
            (id >> 32) as u32,
            ret as u64,
            p.size,
            origin::MMAP,
            w,
        );
    }
    0
}

#[tracepoint]
pub fn ml_munmap(ctx: TracePointContext) -> u32 {
    let tgid = current_tgid();
    if traced(tgid) {
        // Only whole mappings memtrace saw made; anything else is not an
        // allocation it tracks.
        release(
            USER,
            tgid,
            tp_field(&ctx, MEMLEAK_CFG.load().munmap_addr),
            origin::MMAP,
        );
    }
    0
}
