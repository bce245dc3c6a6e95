//! Processes as the kernel programs follow them: forks of the traced
//! process (`--children`, `-c`) and the name each took at its last exec.

use std::collections::HashMap;

use memtrace_common::names::{EXEC_NAMES, FOLLOWED, FOLLOW_FORK, NAME_EXEC};
use memtrace_common::{kind, ProcEvent};

use crate::error::Result;
use crate::session::attach::Probe;
use crate::session::records::comm;
use crate::stacks::Traced;

/// Follows forks of traced processes into FOLLOWED.
pub fn fork_probe() -> Probe {
    Probe::new("process forks").tracepoint(FOLLOW_FORK, "sched", "sched_process_fork")
}

/// A fork or exec of a followed process (`ProcEvent`): its maps are kept
/// for symbolization. False for any other record.
pub fn on_record(data: &[u8], s: &mut Traced) -> bool {
    // Every record passes here: look at its kind before anything else.
    let Some(k @ (kind::PROC_FORK | kind::PROC_EXEC)) = crate::session::records::kind_of(data)
    else {
        return false;
    };
    let Some(ev) = crate::session::records::record::<ProcEvent>(data, k) else {
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

/// `--children` of a running process: its existing descendants join the
/// followed set (the fork probe, attached before, catches any forked
/// meanwhile). Returns how many there were.
pub fn adopt_descendants(s: &mut Traced, root: u32) -> Result<usize> {
    let found = crate::process::proc::descendants(root);
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
pub fn forget_exited(s: &mut Traced) -> Result<usize> {
    let gone: Vec<u32> = s
        .hash_entries(FOLLOWED)
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| !crate::process::proc::alive(*p))
        .collect();
    for p in &gone {
        s.hash_remove(FOLLOWED, p)?;
    }
    s.sym.maps.lock().unwrap().exited(&gone);
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
pub fn exec_names(s: &Traced) -> HashMap<u32, String> {
    s.hash_entries(EXEC_NAMES)
        .into_iter()
        .map(|(pid, e)| (pid, comm(&e.comm)))
        .collect()
}

/// The same with the memory cgroup each was in at its exec (kernfs id).
pub fn exec_identities(s: &Traced) -> HashMap<u32, (String, u64)> {
    s.hash_entries(EXEC_NAMES)
        .into_iter()
        .map(|(pid, e)| (pid, (comm(&e.comm), e.memcg_id)))
        .collect()
}
