//! memtrace: memory event tracing with eBPF.

pub mod attach;
pub mod cli;
pub mod doctor;
pub mod error;
pub mod kernel;
pub mod output;
pub mod run;
pub mod session;
pub mod symbolize;
pub mod tools;
pub mod unwind;

pub use error::{Error, Result};
