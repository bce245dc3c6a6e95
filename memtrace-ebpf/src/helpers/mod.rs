//! Mechanisms every tool shares, one file per concern. Tools import from
//! here; the statics and programs keep their names whatever file holds
//! them (`memtrace_common::names` refers to them by name).

mod atomic;
mod dwarf;
mod emit;
mod exemaps;
mod filter;
mod floor;
mod generation;
mod image;
mod kunwind;
mod process;
mod python;
mod reads;
mod regs;
mod rssstat;
// `snoop_programs!` for the snoop tools: declared before them in main.rs.
#[macro_use]
mod snoop;
mod stacks;
mod unwind_copy;
pub(crate) mod unwind_memo;
mod unwind_rows;
mod unwind_vma;
mod walk;

pub use atomic::atomic_add;
pub use emit::{count_loss, count_refused, emit};
pub use filter::{current_tgid, in_watched_group, wanted, FILTER, MEMCG_WATCH};
pub use generation::count_gen;
pub use image::{image_owner, note_member, tell_member};
pub use reads::{
    css_cgroup_id, current_mm_u64, current_task, fd_file, memcg_id, read, read0, tp_field, TASK,
};
pub use regs::{perf_in_user_mode, Regs};
pub use rssstat::rss_change;
pub use snoop::{syscall_enter, syscall_exit};
pub use stacks::{bump_by_stack, capture_stacks, capturing, stack_ids, Stacks};

/// For maps filled lazily: a preallocated map costs start-up time and locked
/// memory for entries that are mostly never used. Kernels before 5.13 (the
/// compat object's) refuse run-time allocated hash maps in tracepoint,
/// kprobe and uprobe programs: there they are preallocated.
#[cfg(not(feature = "compat"))]
pub const NO_PREALLOC: u32 = aya_ebpf::bindings::BPF_F_NO_PREALLOC as u32;
#[cfg(feature = "compat")]
pub const NO_PREALLOC: u32 = 0;
