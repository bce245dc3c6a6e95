//! `count` and `trace`: one program each for any tracepoint. Which
//! tracepoint fired is the record's `common_type` (its event id), which
//! selects the configuration userspace built from its format file: the
//! fields to key or sum by and the predicates to test.

use aya_ebpf::{
    cty::c_void,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        generated::{bpf_get_attach_cookie, bpf_probe_read_kernel, bpf_probe_read_user_str},
    },
    macros::{map, tracepoint},
    maps::{Array, PerCpuArray, PerCpuHashMap},
    programs::TracePointContext,
    EbpfContext,
};
use memtrace_common::{
    generic::{
        by, CountKey, CountVal, FieldRef, TpConfig, TraceHdr, MAX_COPY, MAX_FILTERS,
        MAX_KEY_FIELDS, MAX_USTR, TRACE_HDR,
    },
    kind, loss, TASK_COMM_LEN,
};

use crate::helpers::{
    bump_by_stack, capture_stacks, count_gen, count_loss, current_task, current_tgid, emit,
    memcg_id, stack_ids, wanted, Stacks, NO_PREALLOC,
};

/// errno of a map insert into a full map.
const E2BIG: i32 = 7;

/// Configurations by the tracepoint's place in userspace's list; userspace
/// sizes it to the tracepoints matched.
#[map]
static COUNT_TPS: Array<TpConfig> = Array::with_max_entries(1024, 0);

#[map]
static COUNTS: PerCpuHashMap<CountKey, CountVal> =
    PerCpuHashMap::with_max_entries(8192, NO_PREALLOC);

#[repr(C)]
pub struct TraceBuf {
    hdr: TraceHdr,
    data: [u8; MAX_COPY + MAX_USTR],
}

#[map]
static TRACE_SCRATCH: PerCpuArray<TraceBuf> = PerCpuArray::with_max_entries(1, 0);

/// The configuration of tracepoint `index` of userspace's list.
#[inline(always)]
fn config(index: u32) -> Option<&'static TpConfig> {
    match COUNT_TPS.get(index) {
        // Not configured yet: before tracing starts, not an event lost.
        Some(c) if c.valid == 0 => None,
        Some(c) => Some(c),
        None => {
            count_loss(loss::READ);
            None
        }
    }
}

/// Which tracepoint fired: the cookie it was attached with. (The record's
/// `common_type` is not filled in yet when the program runs.)
#[inline(always)]
fn cookie(ctx: &TracePointContext) -> u32 {
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) as u32 }
}

/// A field of the record widened to 64 bits; 0 for an unused slot, and a
/// failed read is counted. Both outcomes leave the same kind of value (the
/// helper zeroes it on failure), so the verifier's states stay mergeable:
/// a branch per field ahead of the stack walk made it give up.
#[inline(always)]
fn field(ctx: &TracePointContext, f: &FieldRef) -> u64 {
    if f.size == 0 {
        return 0;
    }
    let mut raw = 0u64;
    let r = unsafe {
        bpf_probe_read_kernel(
            &mut raw as *mut u64 as *mut c_void,
            8,
            (ctx.as_ptr() as *const u8).add(f.offset as usize) as *const c_void,
        )
    };
    if r != 0 {
        count_loss(loss::READ);
    }
    f.widen(raw)
}

/// Whether every `--filter` predicate holds.
#[inline(always)]
fn passes(ctx: &TracePointContext, cfg: &TpConfig) -> bool {
    for p in cfg.filters.iter().take(MAX_FILTERS) {
        if p.op == 0 {
            break;
        }
        if !p.holds(field(ctx, &p.field)) {
            return false;
        }
    }
    true
}

/// The traced process and the tracepoint's configuration, when the event
/// is one to take: a wanted process, a configured tracepoint, every filter
/// holding.
#[inline(always)]
fn selected(ctx: &TracePointContext, index: u32) -> Option<(u32, &'static TpConfig)> {
    let tgid = current_tgid();
    if !wanted(tgid) {
        return None;
    }
    let cfg = config(index)?;
    passes(ctx, cfg).then_some((tgid, cfg))
}

/// Counts an event of any of several tracepoints, told apart by cookie.
#[tracepoint]
pub fn count_tp(ctx: TracePointContext) -> u32 {
    count(&ctx, cookie(&ctx))
}

/// `count_tp` and `trace_tp` for kernels without attach cookies (before
/// 5.15): a program per place in the list, up to eight tracepoints.
macro_rules! at_index {
    ($($count:ident $trace:ident $i:literal;)*) => {$(
        #[tracepoint]
        pub fn $count(ctx: TracePointContext) -> u32 {
            count(&ctx, $i)
        }
        #[tracepoint]
        pub fn $trace(ctx: TracePointContext) -> u32 {
            trace(&ctx, $i)
        }
    )*};
}

at_index! {
    count_one trace_one 0;
    count_at1 trace_at1 1;
    count_at2 trace_at2 2;
    count_at3 trace_at3 3;
    count_at4 trace_at4 4;
    count_at5 trace_at5 5;
    count_at6 trace_at6 6;
    count_at7 trace_at7 7;
}

#[inline(always)]
fn count(ctx: &TracePointContext, index: u32) -> u32 {
    let Some((tgid, cfg)) = selected(ctx, index) else {
        return 0;
    };
    // Stacks first: the walk is the largest part of the program, and the
    // verifier walks it once per distinct state reaching it; the key's
    // optional parts below would multiply those states.
    let add = field(ctx, &cfg.sum);
    let mut st = capture_stacks(ctx, add, cfg.index);
    let mut key = CountKey {
        index: cfg.index,
        ustack: st.user,
        kstack: st.kern,
        ustack_check: st.user_check,
        gen: count_gen(),
        ..Default::default()
    };
    if cfg.by & by::PID != 0 {
        key.tgid = tgid;
    }
    if cfg.by & by::TID != 0 {
        key.tid = bpf_get_current_pid_tgid() as u32;
    }
    if cfg.by & by::COMM != 0 {
        key.comm = bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]);
    }
    if cfg.by & by::CGROUP != 0 {
        // The memory controller's group, v1 or v2 (the unified hierarchy's
        // id says nothing of memory on a v1 host); that id without offsets.
        let memcg = unsafe { memcg_id(current_task()) };
        key.cgroup = match memcg {
            0 => unsafe { bpf_get_current_cgroup_id() },
            id => id,
        };
    }
    for i in 0..MAX_KEY_FIELDS {
        key.fields[i] = field(ctx, &cfg.keys[i]);
    }
    let set_user =
        |k: &mut CountKey, st: &Stacks| (k.ustack, k.ustack_check) = (st.user, st.user_check);
    let bump = |_: &CountKey, v: &mut CountVal| {
        v.count += 1;
        v.sum = v.sum.wrapping_add(add);
    };
    if bump_by_stack(&COUNTS, &mut key, &mut st, set_user, bump) {
        return 0;
    }
    // The name only for a new key: a helper call saved on every other event.
    let v = CountVal {
        count: 1,
        sum: add,
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
    };
    if let Err(e) = COUNTS.insert(&key, &v, 0) {
        // Another CPU may have made the key meanwhile (per-CPU values: the
        // key is there for every CPU): count into it. Otherwise the map is
        // full (E2BIG) or the key could not be allocated here.
        match COUNTS.get_ptr_mut(&key) {
            Some(v) => bump(&key, unsafe { &mut *v }),
            None if e == -E2BIG => count_loss(loss::MAP_FULL),
            None => count_loss(loss::MAP_BUSY),
        }
    }
    0
}

/// Sends an event of any of several tracepoints on, told apart by cookie.
#[tracepoint]
pub fn trace_tp(ctx: TracePointContext) -> u32 {
    trace(&ctx, cookie(&ctx))
}

#[inline(always)]
fn trace(ctx: &TracePointContext, index: u32) -> u32 {
    let Some((tgid, cfg)) = selected(ctx, index) else {
        return 0;
    };
    let Some(buf) = TRACE_SCRATCH.get_ptr_mut(0) else {
        count_loss(loss::RINGBUF);
        return 0;
    };
    let (ustack, kstack) = stack_ids(ctx, 0, cfg.index);
    let mut len = cfg.copy as usize;
    if len > MAX_COPY {
        len = MAX_COPY;
    }
    let base = buf as *mut u8;
    let r = unsafe {
        bpf_probe_read_kernel(
            base.add(TRACE_HDR) as *mut c_void,
            len as u32,
            ctx.as_ptr() as *const c_void,
        )
    };
    if r != 0 {
        count_loss(loss::READ);
        return 0;
    }
    // The user string a syscall argument points to, after the record.
    let mut slen = 0usize;
    if cfg.ustr.size != 0 {
        let ptr = field(ctx, &cfg.ustr);
        let n = unsafe {
            bpf_probe_read_user_str(
                base.add(TRACE_HDR + len) as *mut c_void,
                MAX_USTR as u32,
                ptr as *const c_void,
            )
        };
        if n > 0 {
            slen = (n as usize).min(MAX_USTR);
        } else {
            count_loss(loss::READ);
        }
    }
    let hdr = TraceHdr {
        kind: kind::TRACE,
        index: cfg.index,
        tgid,
        pid: bpf_get_current_pid_tgid() as u32,
        ustack,
        kstack,
        len: len as u32,
        ustr_len: slen as u32,
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
    };
    unsafe { core::ptr::write_unaligned(base as *mut TraceHdr, hdr) };
    let rec = unsafe { core::slice::from_raw_parts(base as *const u8, TRACE_HDR + len + slen) };
    emit::<[u8]>(rec);
    0
}
