//! The command list: one module per tool, each declaring what it is
//! (`ABOUT`), its probes (with fallbacks), the globals its kernel programs
//! need, its aggregation and its report. Adding a tool is one line here
//! (and its `mod` line, written out so that rustfmt visits its file).

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
    ($($(#[$attr:meta])* $module:ident::$ty:ident,)*) => {
        #[derive(Debug, clap::Subcommand)]
        pub enum ToolCommand {
            $(
                #[command(name = $module::ABOUT.name, about = $module::ABOUT.help)]
                $(#[$attr])*
                $ty($module::Args),
            )*
        }

        impl ToolCommand {
            /// The tool these arguments ask for, and its common arguments.
            pub fn build(&self) -> Result<(Box<dyn Tool>, &Common)> {
                match self {
                    $(ToolCommand::$ty(a) => Ok((Box::new($module::$ty::new(a)?), &a.common)),)*
                }
            }
        }

        /// Every tool's subcommand name.
        pub const NAMES: &[&str] = &[$($module::ABOUT.name),*];
    };
}

// One line a tool: its name, help, banner and default interval are its
// `ABOUT`, declared in its own file.
tools! {
    oomkill::Oomkill,
    faults::Faults,
    ffaults::Ffaults,
    brkstack::Brkstack,
    vmscan::Vmscan,
    drsnoop::Drsnoop,
    memcg::Memcg,
    swapin::Swapin,
    rss::Rss,
    mmapsnoop::Mmapsnoop,
    shmsnoop::Shmsnoop,
    memleak::Memleak,
    count::Count,
    trace::Trace,
    // -d is procps top's refresh delay here; the run's length is --duration.
    #[command(mut_arg("duration", |a| a.short(None)))]
    top::Top,
    serve::Serve,
}
