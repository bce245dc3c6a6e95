//! `--stack-mode dwarf`: the user registers and a copy of the top of the
//! user stack go to userspace, which unwinds them with the binaries'
//! .eh_frame.

use aya_ebpf::{
    cty::c_void,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_smp_processor_id,
        generated::bpf_probe_read_user,
    },
    macros::map,
    maps::{Array, PerCpuArray},
};
use memtrace_common::{
    kind, loss,
    stacks::{StackSample, STACK_SAMPLE_HDR, USTACK_IN_SAMPLE, USTACK_NOT_SAMPLED},
    TASK_COMM_LEN,
};

use super::{
    emit::{batched_wakeup, count_loss, EVENTS},
    reads::{stack_top, user_lr, user_regs},
    stacks::USTACK,
};

/// Events seen on this CPU since the last stack copy (`--sample`).
#[map]
static SAMPLE_TICK: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

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

/// Sends the user registers and the top of the user stack (one event in
/// `sample_every`). The tool's `value` and `aux` ride along. Returns the
/// user stack id for the tool's record (the caller holds BUSY: faults of the
/// copy are ours).
#[inline(always)]
#[cfg_attr(feature = "compat", allow(dead_code))]
pub(super) fn sample_user_stack(kstack: i32, value: u64, aux: u32) -> i32 {
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
    // A fault on the page at the stack pointer, as the stack grows into
    // it: nothing was ever written there, and the frames to unwind begin
    // above it. Copied from the next page on, the bytes below left out.
    let mut skip = 0u64;
    if got == 0 {
        let gap = ((sp | 4095) + 1 - sp) & 8191;
        for shift in 0..4 {
            let n = want.saturating_sub(gap) >> shift;
            // gap + n stays inside the scratch buffer.
            if n == 0 || n > (MAX_STACK_COPY - 8192) as u64 {
                break;
            }
            let r = unsafe {
                bpf_probe_read_user(
                    base.add(STACK_SAMPLE_HDR + gap as usize) as *mut c_void,
                    n as u32,
                    (sp + gap) as *const c_void,
                )
            };
            if r == 0 {
                (got, skip) = (gap + n, gap);
                break;
            }
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
        skip: skip as u32,
        _pad: 0,
        ip,
        sp,
        bp,
        lr: user_lr(&cfg),
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
