//! The command list: one module per tool, each declaring what it is
//! (`ABOUT`), its probes (with fallbacks), the globals its kernel programs
//! need, its aggregation and its report. Adding a tool is one line here,
//! which declares its module too (`cargo xtask fmt` formats it: `cargo fmt`
//! does not visit modules a macro declares).

use crate::error::Result;
use crate::run::args::Common;
use crate::run::tool::Tool;

macro_rules! tools {
    ($($(#[$attr:meta])* $module:ident::$ty:ident,)*) => {
        $(pub mod $module;)*

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
    compactsnoop::Compactsnoop,
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
