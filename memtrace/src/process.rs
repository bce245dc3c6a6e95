//! Processes as the kernel programs follow them: forks of the traced
//! process (`--children`, `-c`) and the name each took at its last exec.

use std::collections::HashMap;

use memtrace_common::names::{EXEC_NAMES, FOLLOW_FORK, NAME_EXEC};

use crate::attach::Probe;
use crate::records::comm;
use crate::session::Session;

/// Follows forks of traced processes into FOLLOWED.
pub fn fork_probe() -> Probe {
    Probe::new("process forks").tracepoint(FOLLOW_FORK, "sched", "sched_process_fork")
}

/// Follows execs, for `exec_names`; optional: without it, processes keep the
/// name of their first event.
pub fn exec_probe() -> Probe {
    Probe::new("process execs")
        .tracepoint(NAME_EXEC, "sched", "sched_process_exec")
        .optional()
}

/// Processes that exec'd during the trace, by the name they took (the tool
/// sizes EXEC_NAMES).
pub fn exec_names(s: &Session) -> HashMap<u32, String> {
    s.hash_entries(EXEC_NAMES)
        .into_iter()
        .map(|(pid, c)| (pid, comm(&c)))
        .collect()
}

/// Whether process `pid` still exists.
pub fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}
