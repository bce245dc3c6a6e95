//! memtrace: memory event tracing with eBPF.

/// `eprintln!` that cannot panic (see `output::to_stderr`).
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::output::to_stderr(format_args!($($arg)*))
    };
}

pub mod cli;
pub mod doctor;
pub mod error;
pub mod kernel;
pub mod output;
pub mod probes;
pub mod process;
pub mod record;
pub mod run;
pub mod session;
pub mod stacks;
pub mod tools;

pub use error::{Error, Result};
