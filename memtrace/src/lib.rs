//! memtrace: memory event tracing with eBPF.

/// `eprintln!` that cannot panic (see `output::to_stderr`).
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::output::to_stderr(format_args!($($arg)*))
    };
}

pub mod attach;
pub mod caps;
pub mod cgroup;
pub mod cli;
pub mod command;
pub mod counters;
pub mod doctor;
pub mod entrystop;
pub mod error;
mod events;
pub mod exemaps;
pub mod kept;
pub mod kernel;
pub mod ktables;
pub mod losses;
pub mod oom;
pub mod output;
pub mod pmap;
pub mod proc;
pub mod process;
pub mod reclaim;
pub mod record;
pub mod records;
pub mod rssstat;
pub mod run;
pub mod session;
pub mod snapshot;
pub mod symbolize;
pub mod syscalls;
pub mod tool;
pub mod tools;
pub mod tpspec;
pub mod unwind;
pub mod uprobe;
pub mod ustack;

pub use error::{Error, Result};
