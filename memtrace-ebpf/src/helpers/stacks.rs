//! Stack capture for every tool: kernel stacks by the kernel's stack map,
//! user stacks by the kernel's walker, our own frame-pointer walk (`walk`)
//! or a copy for userspace to unwind (`dwarf`); counting by stack.

use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    macros::map,
    maps::{HashMap, PerCpuArray, PerCpuHashMap, StackTrace},
    programs::tracing::StackIdContext,
    Global,
};
use memtrace_common::{loss, stack_mode, stacks::UstackConfig};

#[cfg(not(feature = "compat"))]
use super::{
    dwarf::sample_user_stack, filter::current_tgid, kunwind::memtrace_unwind_user_stack,
    python::memtrace_python_frames, walk::walk_user_stack,
};
use super::{emit::count_loss, filter::FILTER, walk::store_user_stack};

/// Userspace shrinks this for tools without stacks.
#[map]
pub static STACKS: StackTrace = StackTrace::with_max_entries(8192, 0);

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
    regs_lr: 0,
    _pad: 0,
});

/// A capture's stack ids. `user_check` holds more bits of a walked user
/// stack's hash, for keys that count by stack.
#[derive(Clone, Copy)]
pub struct Stacks {
    pub user: i32,
    pub kern: i32,
    pub user_check: u32,
}

impl Stacks {
    /// No capture (for a path that records nothing).
    pub const NONE: Stacks = Stacks {
        user: -1,
        kern: -1,
        user_check: 0,
    };

    /// For counting tools, on a key their map does not have yet: stores the
    /// walked user stack, or drops it from the key when it cannot be
    /// stored (counted). Keys already in the map skip this, which saves a
    /// lookup per event.
    #[inline(always)]
    pub fn keep(&mut self) {
        if self.user >= 0 && self.user_check != 0 && !store_user_stack(self.user, self.user_check) {
            self.user = -1;
            self.user_check = 0;
        }
    }
}

/// A hash map's value in place: per-CPU maps (where a plain add is exact)
/// and shared ones (where the caller adds atomically).
pub trait Slots<K, V> {
    fn slot(&self, k: &K) -> Option<*mut V>;
}

impl<K, V> Slots<K, V> for PerCpuHashMap<K, V> {
    #[inline(always)]
    fn slot(&self, k: &K) -> Option<*mut V> {
        self.get_ptr_mut(k)
    }
}

impl<K, V> Slots<K, V> for HashMap<K, V> {
    #[inline(always)]
    fn slot(&self, k: &K) -> Option<*mut V> {
        self.get_ptr_mut(k)
    }
}

/// Counting by stack: applies `bump` to `key`'s value and returns true, or
/// returns false when the caller must insert it. The walked user stack is
/// stored only when the key is new (`Stacks::keep`); if it cannot be, the
/// key loses its user stack (`set_user`) and is looked up again.
#[inline(always)]
pub fn bump_by_stack<K, V>(
    map: &impl Slots<K, V>,
    key: &mut K,
    st: &mut Stacks,
    set_user: impl Fn(&mut K, &Stacks),
    bump: impl Fn(&K, &mut V),
) -> bool {
    if let Some(v) = map.slot(&*key) {
        bump(key, unsafe { &mut *v });
        return true;
    }
    let user = st.user;
    st.keep();
    if st.user != user {
        set_user(key, st);
        if let Some(v) = map.slot(&*key) {
            bump(key, unsafe { &mut *v });
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
        user_stack(ctx, mode, &mut st, value, aux);
    }
    set_busy(0);
    st
}

/// The user stack as `mode` says: walked here (frame pointers, or DWARF
/// in the kernel), a copy for userspace, or the kernel's walker.
#[cfg(not(feature = "compat"))]
#[inline(always)]
fn user_stack<C: StackIdContext>(ctx: &C, mode: u32, st: &mut Stacks, value: u64, aux: u32) {
    {
        if mode & stack_mode::WALK != 0 {
            // A constant to the verifier (frozen .rodata): the other way is
            // never checked.
            (st.user, st.user_check) = if mode & stack_mode::KUNWIND != 0 {
                let mut r = memtrace_unwind_user_stack();
                // Python's frames after the native ones: a call of its
                // own, not one more on the unwinder's chain of calls
                // (whose stack has no room to spare on 6.1).
                if r >> 32 != u32::MAX as u64 {
                    let p = memtrace_python_frames(current_tgid());
                    if p != u64::MAX {
                        r = p;
                    }
                }
                ((r >> 32) as u32 as i32, r as u32)
            } else {
                walk_user_stack()
            };
            // Never 0 for a walked stack: 0 means nothing to store.
            st.user_check |= 1;
        } else if mode & stack_mode::DWARF != 0 {
            st.user = sample_user_stack(st.kern, value, aux);
        } else {
            match ctx.get_stackid(&STACKS, BPF_F_USER_STACK as u64) {
                Ok(id) => st.user = id as i32,
                Err(_) => count_loss(loss::STACK),
            }
        }
    }
}

/// Without bpf_loop (the compat object) the kernel's frame-pointer walker
/// is the only way; its stacks are kept by their own hash (`WALK`, which
/// userspace sets where it can size the store), else in the stack map.
#[cfg(feature = "compat")]
#[inline(always)]
fn user_stack<C: StackIdContext>(ctx: &C, mode: u32, st: &mut Stacks, _value: u64, _aux: u32) {
    if mode & stack_mode::WALK != 0 {
        (st.user, st.user_check) = super::walk::kernel_walk_user_stack(ctx.as_ptr());
        if st.user >= 0 {
            st.user_check |= 1;
        }
        return;
    }
    match ctx.get_stackid(&STACKS, BPF_F_USER_STACK as u64) {
        Ok(id) => st.user = id as i32,
        Err(_) => count_loss(loss::STACK),
    }
}

/// `capture_stacks` with the user stack stored: for tools that send each
/// event on.
#[inline(always)]
pub fn stack_ids<C: StackIdContext>(ctx: &C, value: u64, aux: u32) -> (i32, i32) {
    let mut st = capture_stacks(ctx, value, aux);
    st.keep();
    (st.user, st.kern)
}
