//! `rss`: every change of a traced process's RSS counters (kmem:rss_stat),
//! kept per process with its peak; the threshold is checked here, at the
//! change that crosses it, so the stack is the allocating task's.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
    Global,
};
use memtrace_common::{
    kind, loss,
    rss::{RssConfig, RssCross, RssExit, RssExitConfig, RssVal, NR},
    TASK_COMM_LEN,
};

use crate::helpers::{
    count_loss, current_task, current_tgid, emit, read0, rss_change, stack_ids, wanted, NO_PREALLOC,
};

#[unsafe(no_mangle)]
static RSS_CFG: Global<RssConfig> = Global::new(RssConfig::INIT);

#[unsafe(no_mangle)]
static RSS_EXIT_CFG: Global<RssExitConfig> = Global::new(RssExitConfig {
    tp_group_dead: 0,
    task_signal: 0,
    signal_live: 0,
    _pad: 0,
});

/// mm_id (a hash of the mm pointer) -> the process that owns it, learnt from
/// events where the mm is current's; other tasks (reclaim, kswapd) change it too.
#[map]
static RSS_OWNER: HashMap<u32, u32> = HashMap::with_max_entries(4096, NO_PREALLOC);

#[map]
static RSS: HashMap<u32, RssVal> = HashMap::with_max_entries(4096, NO_PREALLOC);

/// Bytes of excluded mappings per process, kept current by userspace.
#[map]
static RSS_EXCLUDED: HashMap<u32, u64> = HashMap::with_max_entries(4096, NO_PREALLOC);

#[tracepoint]
pub fn rss_stat(ctx: TracePointContext) -> u32 {
    let c = RSS_CFG.load();
    // This fires on every RSS change on the host: decide on the process
    // first, read the rest only for traced ones.
    let (Ok(mm_id), Ok(curr)) = (unsafe {
        (
            ctx.read_at::<u32>(c.tp_mm_id as usize),
            ctx.read_at::<u32>(c.tp_curr as usize),
        )
    }) else {
        count_loss(loss::READ);
        return 0;
    };
    let tgid = if curr != 0 {
        current_tgid()
    } else {
        match unsafe { RSS_OWNER.get(mm_id) } {
            Some(t) => *t,
            None => return 0,
        }
    };
    if !wanted(tgid) {
        return 0;
    }
    // Learn (or correct: mm ids are hashes and get reused) the owner, with
    // a write only when it changes, not at every RSS change.
    if curr != 0
        && unsafe { RSS_OWNER.get(mm_id) }.is_none_or(|o| *o != tgid)
        && RSS_OWNER.insert(mm_id, tgid, 0).is_err()
    {
        count_loss(loss::MAP_FULL);
    }
    let Some((slot, size)) = rss_change(&ctx, &c) else {
        return 0;
    };
    let Some(v) = RSS.get_ptr_mut(tgid) else {
        let mut v = RssVal {
            bytes: [0; NR],
            peak: 0,
            crossed: 0,
            set: 0,
            comm: [0; TASK_COMM_LEN],
            exited: 0,
            _pad: 0,
        };
        if slot < NR {
            v.bytes[slot] = size;
            v.set |= 1 << slot;
        }
        if curr != 0 {
            v.comm = bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]);
        }
        if RSS.insert(tgid, v, 0).is_err() {
            count_loss(loss::MAP_FULL);
        }
        return 0;
    };
    // One CPU at a time per process is not guaranteed; a racing update can
    // only leave an older absolute value, which the next event replaces.
    let v = unsafe { &mut *v };
    if v.exited != 0 {
        // Its mm torn down after its last thread left, or a new process
        // under its pid before userspace let the old row go.
        return 0;
    }
    if slot < NR {
        v.bytes[slot] = size;
        v.set |= 1 << slot;
    }
    let total = (v.bytes[0] + v.bytes[1] + v.bytes[3]).max(0) as u64;
    if total > v.peak {
        v.peak = total;
    }
    if c.threshold == 0 || v.crossed != 0 {
        return 0;
    }
    // Read through a pointer: an Option<u64> here let LLVM read an uninitialized register.
    let excluded = RSS_EXCLUDED
        .get_ptr(tgid)
        .map(|p| unsafe { *p })
        .unwrap_or(0);
    if total.saturating_sub(excluded) <= c.threshold {
        return 0;
    }
    v.crossed = 1;
    let (ustack, kstack) = stack_ids(&ctx, 0, 0);
    let id = bpf_get_current_pid_tgid();
    emit(&RssCross {
        kind: kind::RSS_CROSS,
        pid: tgid,
        task_pid: (id >> 32) as u32,
        task_tid: id as u32,
        bytes: v.bytes,
        excluded,
        ustack,
        kstack,
        comm: v.comm,
        task_comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
    });
    0
}

/// `sched:sched_process_exit`: a followed process's last thread left. Its
/// row goes to userspace now, with its peak, so that a process that lived
/// between two reports still gets its exit row. Every thread exit on the host passes here: the row lookup first.
#[tracepoint]
pub fn rss_exit(ctx: TracePointContext) -> u32 {
    let tgid = current_tgid();
    let Some(v) = RSS.get_ptr_mut(tgid) else {
        return 0;
    };
    let c = RSS_EXIT_CFG.load();
    let dead = if c.tp_group_dead != 0 {
        match unsafe { ctx.read_at::<u8>(c.tp_group_dead as usize) } {
            Ok(d) => d != 0,
            Err(_) => {
                count_loss(loss::READ);
                return 0;
            }
        }
    } else {
        // Decremented before the tracepoint, as `group_dead` is computed.
        let signal: *const u8 = unsafe { read0(current_task(), c.task_signal) };
        !signal.is_null() && unsafe { read0::<i32>(signal, c.signal_live) } == 0
    };
    if !dead {
        return 0;
    }
    let v = unsafe { &mut *v };
    v.exited = 1;
    let total = (v.bytes[0] + v.bytes[1] + v.bytes[3]).max(0) as u64;
    let rec = RssExit {
        kind: kind::RSS_EXIT,
        pid: tgid,
        bytes: v.bytes,
        peak: v.peak.max(total),
        comm: bpf_get_current_comm().unwrap_or(v.comm),
    };
    // Userspace lets the row go when the record comes; lost (counted), the
    // row stays, marked, and the next report prints it from here.
    emit(&rec);
    0
}
