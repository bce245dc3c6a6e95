//! The memory cgroup each process a stack came from was in, by path, for
//! the stacks' labels (records, pprof, OTLP): read from /proc while the
//! process lives, else from the group the kernel saw it exec in.

use std::collections::HashMap;

/// Processes' groups kept at most (a churning host's pids come and go).
const MAX_PIDS: usize = 1 << 16;

#[derive(Default)]
pub struct Groups {
    by_pid: HashMap<u32, Option<String>>,
    /// kernfs id -> path: finding one walks the hierarchy.
    by_id: HashMap<u64, Option<String>>,
}

impl Groups {
    /// `pid`'s group path; `exec_id` gives the kernfs id of the group it
    /// exec'd in, asked for only when /proc no longer has the process.
    pub fn of(&mut self, pid: u32, exec_id: impl FnOnce() -> Option<u64>) -> Option<String> {
        if pid == 0 {
            return None;
        }
        if let Some(g) = self.by_pid.get(&pid) {
            return g.clone();
        }
        let g = Some(super::proc::cgroup_of(pid))
            .filter(|g| !g.is_empty())
            .or_else(|| {
                let id = exec_id()?;
                self.by_id
                    .entry(id)
                    .or_insert_with(|| crate::kernel::cgroupid::path_of(id).map(|(_, p)| p))
                    .clone()
            });
        if self.by_pid.len() >= MAX_PIDS {
            self.by_pid.clear();
        }
        self.by_pid.insert(pid, g.clone());
        g
    }
}
