//! The process model: ancestry and the names processes took at exec, their
//! mappings (learned in the kernel and read from /proc, which is parsed here
//! once), their memory cgroups, and `-c` with its entry stop.

pub mod cgroup;
pub mod command;
pub mod container;
pub mod entrystop;
pub mod exemaps;
pub mod follow;
pub mod groups;
pub mod pmap;
pub mod proc;
