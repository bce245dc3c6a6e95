//! Heap tracking that memleak and memcg's `--heap` share: the allocator
//! entry points of the object a process maps and where each is probed,
//! the kernel's allocator tracepoints, and what is outstanding by stack
//! (with what exited processes and exec'd images held).

pub mod entries;
pub mod execs;
pub mod exited;
pub mod points;
pub mod report;
pub mod watch;

/// The preloaded shim's file name starts so: a stack's first frames in it
/// are dropped, so that a stack starts at the allocator's caller, as with
/// uprobes.
pub const SHIM_PREFIX: &str = "memtrace-preload-";
