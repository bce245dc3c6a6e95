//! Counts keyed by image: a process forked without exec runs its parent's
//! code at its parent's addresses, so identical stacks of the processes of
//! one image (one exec, one name) are one key, under the eldest's pid: its
//! own counts, and those of every process forked from it (the key marked
//! forked). A churn of forked children (backends, workers) then costs the
//! count map two entries per stack, not one per process and stack; which
//! forked processes took each key goes to userspace once per change
//! (`StackMember`), none for a process that never forks.

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_RING_SIZE},
    Global,
};
use memtrace_common::{
    kind, loss,
    stacks::{ImageOffsets, StackMember, MAX_IMAGE_LEVELS},
    TASK_COMM_LEN,
};

use super::{
    emit::{batched_wakeup, count_loss, EVENTS},
    filter::wanted,
    reads::{current_task_typed, field},
};

/// Set by userspace for the tools that count by stack, unless `--per-pid`.
#[unsafe(no_mangle)]
pub static IMAGE: Global<ImageOffsets> = Global::new(ImageOffsets {
    task_group_leader: 0,
    task_real_parent: 0,
    task_tgid: 0,
    task_comm: 0,
    task_mm: 0,
    mm_exe_file: 0,
    mm_mmap_base: 0,
    levels: 0,
});

/// What two processes of one image share: the executable's open file (a
/// new one at every exec), where the mappings start (randomized at exec,
/// copied at fork) and the name.
#[derive(PartialEq, Eq)]
struct Image {
    exe: u64,
    base: u64,
    comm: [u8; TASK_COMM_LEN],
}

#[inline(always)]
unsafe fn image_of(o: &ImageOffsets, task: *const u8) -> Option<Image> {
    let mm: *const u8 = unsafe { field(task, o.task_mm) };
    if mm.is_null() {
        return None;
    }
    Some(Image {
        exe: unsafe { field(mm, o.mm_exe_file) },
        base: unsafe { field(mm, o.mm_mmap_base) },
        comm: unsafe { field(task, o.task_comm) },
    })
}

/// The pid the current process's counts are keyed under: its own, or its
/// eldest traced ancestor of the same image. A function of its own: its
/// reads stay off the stack of the programs that also unwind.
#[inline(never)]
pub fn image_owner(tgid: u32) -> u32 {
    let o = IMAGE.load();
    if o.levels == 0 {
        return tgid;
    }
    let mut t: *const u8 = unsafe { field(current_task_typed(), o.task_group_leader) };
    let Some(me) = (unsafe { image_of(&o, t) }) else {
        return tgid;
    };
    if me.exe == 0 {
        return tgid;
    }
    let mut owner = tgid;
    for i in 0..MAX_IMAGE_LEVELS {
        if i >= o.levels {
            break;
        }
        let p: *const u8 = unsafe { field(t, o.task_real_parent) };
        if p.is_null() || unsafe { image_of(&o, p) }.is_none_or(|im| im != me) {
            break;
        }
        let ptgid: u32 = unsafe { field(p, o.task_tgid) };
        if ptgid == 0 || ptgid == owner || !wanted(ptgid) {
            break;
        }
        owner = ptgid;
        t = p;
    }
    owner
}

/// Tells userspace that forked process `tgid` counted under its image's key
/// (`owner`, stacks) when it is not the process that counted there last on
/// this CPU (`last`, in the value): one record per change, none per event.
#[inline(always)]
pub fn note_member(last: &mut u32, tgid: u32, owner: u32, ustack: i32, kstack: i32) {
    if *last == tgid {
        return;
    }
    *last = tgid;
    tell_member(tgid, owner, ustack, kstack);
}

/// Tells userspace that forked process `tgid` counted under its image's
/// key: at a new key (whose value starts with `last` = `tgid`), and at a
/// change. A function of its own: inlined, its record joined the stack of
/// programs that also unwind, past the 512 bytes kernels before 6.13 allow.
#[inline(never)]
pub fn tell_member(tgid: u32, owner: u32, ustack: i32, kstack: i32) {
    // Never at the cost of the records that carry events or mappings: a
    // burst of forks leaves them half the buffer.
    if EVENTS.query(BPF_RB_AVAIL_DATA as u64) > EVENTS.query(BPF_RB_RING_SIZE as u64) / 2 {
        count_loss(loss::MEMBER_LOST);
        return;
    }
    let rec = StackMember {
        kind: kind::STACK_MEMBER,
        member: tgid,
        owner,
        ustack,
        kstack,
        _pad: 0,
    };
    if EVENTS
        .output::<StackMember>(&rec, batched_wakeup())
        .is_err()
    {
        count_loss(loss::MEMBER_LOST);
    }
}
