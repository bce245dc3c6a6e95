//! `--heap`: the heap of the watched groups' processes, by stack, shown at
//! each warning (the processes that grew most) and each OOM kill (the
//! victim), from the samples taken since start or since the process joined.

use std::collections::HashSet;

use super::Memcg;
use crate::error::Result;
use crate::output::Printer;
use crate::session::Session;

impl Memcg {
    /// Every process in the watched groups and in the groups below them.
    pub(super) fn members(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .groups
            .iter()
            .flat_map(|w| w.group.with_descendants())
            .flat_map(|g| g.procs())
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Processes that started in or moved into a group since the last look
    /// are followed from now (forks of followed ones are from their fork).
    pub(super) fn follow_members(&mut self, s: &mut Session) -> Result<()> {
        if self.heap.is_none() {
            return Ok(());
        }
        let pids = self.members();
        match self.heap.as_mut() {
            Some(h) => h.follow(s, &pids, false),
            None => Ok(()),
        }
    }

    /// The processes of `among` that hold most (five at most).
    pub(super) fn biggest_of(
        &mut self,
        among: &HashSet<u32>,
        s: &mut Session,
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
        s: &mut Session,
        out: &mut dyn Printer,
    ) -> Result<()> {
        match self.heap.as_mut() {
            Some(h) => h.report(s, pids, kind, title, out),
            None => Ok(()),
        }
    }
}
