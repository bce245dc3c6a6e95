//! `memcg`: RSS changes of the processes in watched memory cgroups (the
//! group ids, descendants included, are set by userspace in MEMCG_WATCH),
//! with the user stack of each process's latest growth.

use aya_ebpf::{
    helpers::bpf_get_current_comm,
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
    Global,
};
use memtrace_common::{
    kind, loss,
    memcg::{MemcgCross, MemcgLine, MemcgOffsets, MemcgProc, MAX_LEVELS, STACK_STEP},
    rss::{RssConfig, NR},
    TASK_COMM_LEN,
};

use crate::helpers::{
    count_loss, css_cgroup_id, current_task, current_tgid, emit, read0, rss_change, stack_ids,
    MEMCG_WATCH, NO_PREALLOC, TASK,
};

#[unsafe(no_mangle)]
static MEMCG_CFG: Global<RssConfig> = Global::new(RssConfig::INIT);

#[unsafe(no_mangle)]
static MEMCG_OFFS: Global<MemcgOffsets> = Global::new(MemcgOffsets {
    css_parent: 0,
    memcg_css: 0,
    memcg_memory: 0,
    counter_usage: 0,
    valid: 0,
});

/// Warning lines by the kernfs id of the group that sets the limit.
#[map]
static MEMCG_LINES: HashMap<u64, MemcgLine> = HashMap::with_max_entries(1024, NO_PREALLOC);

#[map]
static MEMCG_PROCS: HashMap<u32, MemcgProc> = HashMap::with_max_entries(4096, NO_PREALLOC);

/// The current task's memory css, its group's id and that group's watch
/// entry, for a change the task makes to its own mm (`curr`): those are its
/// allocations, with its stack (reclaim changing it from elsewhere is not).
#[inline(always)]
fn watched(ctx: &TracePointContext, c: &RssConfig) -> Option<(*const u8, u64, u8)> {
    let Ok(curr) = (unsafe { ctx.read_at::<u32>(c.tp_curr as usize) }) else {
        count_loss(loss::READ);
        return None;
    };
    let t = TASK.load();
    if curr == 0 || t.valid == 0 {
        return None;
    }
    let css = unsafe {
        let cset = read0::<*const u8>(current_task(), t.cgroups);
        read0::<*const u8>(cset, t.css_set_subsys + t.memory_cgrp_id * 8)
    };
    let memcg = unsafe { css_cgroup_id(css) };
    let up = unsafe { MEMCG_WATCH.get(&memcg) }.copied()?;
    Some((css, memcg, up))
}

/// The RSS counters of the watched groups' processes, with the stack of
/// each one's latest growth.
#[tracepoint]
pub fn memcg_rss(ctx: TracePointContext) -> u32 {
    let c = MEMCG_CFG.load();
    let Some((_, memcg, _)) = watched(&ctx, &c) else {
        return 0;
    };
    let Some((slot, size)) = rss_change(&ctx, &c) else {
        return 0;
    };
    let tgid = current_tgid();
    let Some(v) = MEMCG_PROCS.get_ptr_mut(&tgid) else {
        let mut v = MemcgProc {
            bytes: [0; NR],
            stack_at: 0,
            memcg_id: memcg,
            ustack: -1,
            kstack: -1,
            comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
        };
        v.bytes[slot] = size;
        if MEMCG_PROCS.insert(&tgid, &v, 0).is_err() {
            count_loss(loss::MAP_FULL);
        }
        return 0;
    };
    let v = unsafe { &mut *v };
    v.bytes[slot] = size;
    v.memcg_id = memcg;
    let total = (v.bytes[0] + v.bytes[1] + v.bytes[3]).max(0) as u64;
    if total < v.stack_at {
        // Shrunk: the next growth step is counted from here.
        v.stack_at = total;
    }
    if total < v.stack_at + STACK_STEP {
        return 0;
    }
    // The entry is looked up again after the walk: little kept live across
    // it, which the 6.1 verifier needs to bound the walk's reads.
    let (ustack, kstack) = stack_ids(&ctx, 0, 0);
    if let Some(v) = MEMCG_PROCS.get_ptr_mut(&tgid) {
        let v = unsafe { &mut *v };
        v.ustack = ustack;
        v.kstack = kstack;
        v.stack_at = total;
        // Its name now: it may have exec'd since it was first seen.
        v.comm = bpf_get_current_comm().unwrap_or(v.comm);
    }
    0
}

/// The usage of the group that sets a watched group's limit, checked
/// against its warning line at each allocation in the group: a program of
/// its own, as one with the stack walk too was more than the 6.1 verifier
/// would take.
#[tracepoint]
pub fn memcg_line(ctx: TracePointContext) -> u32 {
    let c = MEMCG_CFG.load();
    let Some((css, memcg, up)) = watched(&ctx, &c) else {
        return 0;
    };
    let Some((limit_id, usage, crossed, stepped)) = check_line(css, up) else {
        return 0;
    };
    for (k, now) in [(kind::MEMCG_CROSS, crossed), (kind::MEMCG_STEP, stepped)] {
        if now {
            emit(&MemcgCross {
                kind: k,
                pid: current_tgid(),
                limit_id,
                task_id: memcg,
                usage_pages: usage,
                comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
            });
        }
    }
    0
}

/// The usage of the group that sets the limit, `up` levels above the
/// task's group (its css), read from its page counter now, against its
/// warning line and its next step: that group's id, its usage in pages,
/// whether it crossed the line now (once: the line is then marked crossed)
/// and whether it reached a new tenth of its limit. The levels come from
/// userspace: one map lookup, not one per level.
#[inline(always)]
fn check_line(css: *const u8, up: u8) -> Option<(u64, u64, bool, bool)> {
    let o = MEMCG_OFFS.load();
    if o.valid == 0 || up >= MAX_LEVELS {
        return None;
    }
    let mut css = css;
    for i in 0..MAX_LEVELS {
        if i >= up {
            break;
        }
        css = unsafe { read0::<*const u8>(css, o.css_parent) };
    }
    let id = unsafe { css_cgroup_id(css) };
    let line = unsafe { &mut *MEMCG_LINES.get_ptr_mut(&id)? };
    if line.crossed != 0 && line.step_pages == 0 {
        return None;
    }
    let memcg = css.wrapping_sub(o.memcg_css as usize);
    let usage: u64 = unsafe { read0(memcg, o.memcg_memory + o.counter_usage) };
    let crossed = line.crossed == 0 && usage >= line.pages;
    if crossed {
        line.crossed = 1;
    }
    let step = line.step_pages;
    let stepped = step != 0 && usage >= line.next_step;
    if stepped {
        line.next_step = (usage / step + 1) * step;
    }
    (crossed || stepped).then_some((id, usage, crossed, stepped))
}
