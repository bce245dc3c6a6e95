//! User and kernel stacks: how they are taken (`--stack-mode`), the unwind
//! tables the kernel programs read, unwinding in memtrace, symbolization and
//! the counts kept by stack.

pub mod args;
pub mod buildid;
pub mod gopclntab;
pub mod kept;
pub mod ktables;
pub mod members;
pub mod python;
pub mod sections;
pub mod store;
pub mod symbolize;
mod traced;
pub mod unwind;
pub mod ustack;

pub use traced::Traced;
