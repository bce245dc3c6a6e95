//! The command list: one module per tool, each declaring its probes (with
//! fallbacks), the globals its kernel programs need, its aggregation and its
//! report. Adding a tool is one line here.

use crate::error::Result;
use crate::run::args::Common;
use crate::run::tool::Tool;

// Declared here, not by `tools!`, so that rustfmt visits every tool's file.
pub mod brkstack;
pub mod count;
pub mod drsnoop;
pub mod faults;
pub mod ffaults;
pub mod memcg;
pub mod memleak;
pub mod mmapsnoop;
pub mod oomkill;
pub mod rss;
pub mod serve;
pub mod shmsnoop;
pub mod swapin;
pub mod top;
pub mod trace;
pub mod vmscan;

macro_rules! tools {
    ($($(#[$doc:meta])* $variant:ident => $module:ident::$ty:ident,)*) => {
        #[derive(Debug, clap::Subcommand)]
        pub enum ToolCommand {
            $($(#[$doc])* $variant($module::Args),)*
        }

        impl ToolCommand {
            /// The tool these arguments ask for, and its common arguments.
            pub fn build(&self) -> Result<(Box<dyn Tool>, &Common)> {
                match self {
                    $(ToolCommand::$variant(a) => Ok((Box::new($module::$ty::new(a)?), &a.common)),)*
                }
            }
        }

        /// Every tool's subcommand name.
        pub const NAMES: &[&str] = &[$(stringify!($module)),*];
    };
}

tools! {
    /// OOM kills: trigger, victim, RSS, memcg, pages considered.
    Oomkill => oomkill::Oomkill,
    /// Page faults counted in the kernel, by process, stack or mapping.
    Faults => faults::Faults,
    /// File-backed page faults by file.
    Ffaults => ffaults::Ffaults,
    /// Heap growth (brk) counted by user stack.
    Brkstack => brkstack::Brkstack,
    /// Reclaim dashboard: slab, direct and memcg reclaim time per interval.
    Vmscan => vmscan::Vmscan,
    /// One line per direct or memcg reclaim stall.
    Drsnoop => drsnoop::Drsnoop,
    /// Memory cgroups: usage against the limit in force, pressure, events, and a warning before the OOM kill.
    Memcg => memcg::Memcg,
    /// Swap-ins by process (needs kprobe or fentry).
    Swapin => swapin::Swapin,
    /// RSS of a process from the kernel's counter changes, with a threshold guard.
    Rss => rss::Rss,
    /// One line per mmap, munmap, mremap and brk call, with its result.
    Mmapsnoop => mmapsnoop::Mmapsnoop,
    /// One line per SysV shm call (shmget, shmat, shmdt, shmctl).
    Shmsnoop => shmsnoop::Shmsnoop,
    /// Allocations outstanding by stack: a process's allocator, or the kernel's.
    Memleak => memleak::Memleak,
    /// Events of any tracepoint counted in the kernel, by process, stack or field.
    Count => count::Count,
    /// One line per event of any tracepoint, fields decoded from its format.
    Trace => trace::Trace,
    /// Live table of memory activity by process: RSS, faults, brk, mmap, reclaim, OOM kills.
    // -d is procps top's refresh delay here; the run's length is --duration.
    #[command(mut_arg("duration", |a| a.short(None)))]
    Top => top::Top,
    /// Keep the counters attached and serve them to Prometheus on /metrics.
    Serve => serve::Serve,
}
