//! Processes as the kernel programs follow them: forks of the traced
//! process (`--children`, `-c`) and the name each took at its last exec.

use std::collections::HashMap;

use memtrace_common::names::{EXEC_NAMES, FOLLOWED, FOLLOW_FORK, NAME_EXEC};
use memtrace_common::{kind, ProcEvent};

use crate::error::Result;
use crate::probes::records::comm;
use crate::session::attach::Probe;
use crate::session::Session;

/// Follows forks of traced processes into FOLLOWED.
pub fn fork_probe() -> Probe {
    Probe::new("process forks").tracepoint(FOLLOW_FORK, "sched", "sched_process_fork")
}

/// A fork or exec of a followed process (`ProcEvent`): its maps are kept
/// for symbolization. False for any other record.
pub fn on_record(data: &[u8], s: &mut Session) -> bool {
    // Every record passes here: look at its kind before anything else.
    let kind = data
        .get(..4)
        .map(|k| u32::from_ne_bytes([k[0], k[1], k[2], k[3]]));
    let Some(k @ (kind::PROC_FORK | kind::PROC_EXEC)) = kind else {
        return false;
    };
    let Some(ev) = crate::probes::records::record::<ProcEvent>(data, k) else {
        return false;
    };
    let mut maps = s.sym.maps.lock().unwrap();
    if k == kind::PROC_FORK {
        maps.inherit(ev.parent, ev.pid);
    } else if !maps.learns {
        // Else the exec is handled from its `PROC_IMAGE` record.
        maps.exec(ev.pid);
    }
    true
}

/// Every descendant of `root` alive now, found through /proc.
pub fn descendants(root: u32) -> Vec<u32> {
    let parents: HashMap<u32, u32> = crate::process::proc::pids()
        .into_iter()
        .filter_map(|p| Some((p, crate::process::proc::parent_of(p)?)))
        .collect();
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (&child, _) in parents.iter().filter(|(_, &pp)| pp == p) {
            out.push(child);
            frontier.push(child);
        }
    }
    out.sort_unstable();
    out
}

/// `--children` of a running process: its existing descendants join the
/// followed set (the fork probe, attached before, catches any forked
/// meanwhile). Returns how many there were.
pub fn adopt_descendants(s: &mut Session, root: u32) -> Result<usize> {
    let found = descendants(root);
    for &p in &found {
        s.hash_insert(FOLLOWED, p, 1u8, 0)?;
    }
    // Unwound in the kernel, their stacks need their tables from the start.
    let mut maps = s.sym.maps.lock().unwrap();
    if maps.ktables.is_some() {
        for &p in &found {
            maps.snapshot(p);
        }
    }
    Ok(found.len())
}

/// Forgets followed processes that have exited: under churn (a build, a
/// shell loop) FOLLOWED filled after 8192 children and later ones went
/// unfollowed. Returns how many.
pub fn forget_exited(s: &mut Session) -> Result<usize> {
    let gone: Vec<u32> = s
        .hash_entries(FOLLOWED)
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| !crate::process::proc::alive(*p))
        .collect();
    for p in &gone {
        s.hash_remove(FOLLOWED, p)?;
    }
    Ok(gone.len())
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
        .map(|(pid, e)| (pid, comm(&e.comm)))
        .collect()
}

/// The same with the memory cgroup each was in at its exec (kernfs id).
pub fn exec_identities(s: &Session) -> HashMap<u32, (String, u64)> {
    s.hash_entries(EXEC_NAMES)
        .into_iter()
        .map(|(pid, e)| (pid, (comm(&e.comm), e.memcg_id)))
        .collect()
}

/// Whether process `pid` still exists.
pub fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}
