//! The process model as /proc gives it (parsed here, once): ancestry,
//! mappings, memory cgroups and containers, and `-c` with its entry stop.
//! What the kernel programs tell of processes (forks, exec names, mappings
//! made) is read by probes, one wing up.

pub mod cgroup;
pub mod command;
pub mod container;
pub mod entrystop;
pub mod goheap;
pub mod groups;
pub mod inject;
pub mod maps;
pub mod pmap;
pub mod proc;
pub mod ptregs;
