//! `--heap`: the heap of the watched groups' processes, by stack, shown at
//! each warning (the processes that grew most) and each OOM kill (the
//! victim), from the samples taken since start or since the process joined.

use std::collections::HashSet;

use super::Memcg;
use crate::error::Result;
use crate::output::Printer;
use crate::process::cgroup::Group;
use crate::stacks::Traced;

impl Memcg {
    /// Every process in the watched groups and in the groups below them.
    pub(super) fn members(&self) -> Vec<u32> {
        let all: Vec<Group> = self
            .groups
            .iter()
            .flat_map(|w| w.group.with_descendants())
            .collect();
        members_of(&all)
    }

    /// Processes that started in or moved into a group since the last look
    /// are followed from now (the kernel counts their calls from the moment
    /// they are in: this reads their maps, and probes a new allocator).
    /// `all`: the groups and their descendants, as the sample walked them.
    pub(super) fn follow_members(&mut self, all: &[Group], s: &mut Traced) -> Result<()> {
        match self.heap.as_mut() {
            Some(h) => h.follow(s, &members_of(all), false),
            None => Ok(()),
        }
    }

    /// The processes of `among` that hold most (five at most).
    pub(super) fn biggest_of(
        &mut self,
        among: &HashSet<u32>,
        s: &mut Traced,
    ) -> Result<HashSet<u32>> {
        match self.heap.as_mut() {
            Some(h) => Ok(h.biggest(s, among, 5)?.into_iter().collect()),
            None => Ok(HashSet::new()),
        }
    }

    /// What `pids` hold by stack, printed as `kind` under `title`.
    pub(super) fn heap_of(
        &mut self,
        pids: &HashSet<u32>,
        kind: &'static str,
        title: &str,
        s: &mut Traced,
        out: &mut dyn Printer,
    ) -> Result<()> {
        match self.heap.as_mut() {
            Some(h) => h.report(s, pids, kind, title, out),
            None => Ok(()),
        }
    }
}

/// The processes of `groups`, each once.
fn members_of(groups: &[Group]) -> Vec<u32> {
    let mut pids: Vec<u32> = groups.iter().flat_map(Group::procs).collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}
