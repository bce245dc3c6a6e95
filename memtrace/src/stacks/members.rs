//! Which processes counted under each stack keyed by image. The kernel keeps
//! one count for the forked processes of one image (`image_owner`) and says
//! once per change which process counted (`StackMember`): the rows still
//! say how many processes took a stack, and which.

use std::collections::HashMap;

use roaring::RoaringBitmap;

use memtrace_common::stacks::StackMember;

use crate::output::StackReport;

/// The processes a row counts: each once, up to a bound, then each new one
/// counted (a churn of processes brings new pids only, but for reuse). A
/// compressed bitmap: a churn's pids are close together, and a row of
/// 16,384 of them takes about 8 KiB instead of a hash set's 200 (`faults
/// --stacks` under the soak's churn held 9 MB of such sets).
#[derive(Clone, Debug, Default)]
pub struct Pids {
    pub set: RoaringBitmap,
    pub more: usize,
}

/// Pids kept per row.
const MAX_PIDS: usize = 1 << 14;

impl Pids {
    pub fn one(pid: u32) -> Pids {
        let mut p = Pids::default();
        p.set.insert(pid);
        p
    }

    /// How many processes: those named and those counted past the bound.
    pub fn count(&self) -> usize {
        self.set.len() as usize + self.more
    }

    pub fn insert(&mut self, pid: u32) {
        if (self.set.len() as usize) < MAX_PIDS {
            self.set.insert(pid);
        } else if !self.set.contains(pid) {
            self.more += 1;
        }
    }

    /// The processes a report counts: its pid, the others it names, and
    /// those it counts without naming them.
    pub fn of(r: &StackReport) -> Pids {
        let mut p = Pids::one(r.pid);
        p.absorb(r);
        p
    }

    /// Adds a report's processes (`of`).
    pub fn absorb(&mut self, r: &StackReport) {
        self.insert(r.pid);
        for pid in &r.pids {
            self.insert(*pid);
        }
        self.more += r.processes.saturating_sub(1 + r.pids.len());
    }
}

/// A count key of an image: the owner's pid and the stack ids.
type Key = (u32, i32, i32);

#[derive(Default)]
pub struct Members {
    by_key: HashMap<Key, Pids>,
}

impl Members {
    pub fn note(&mut self, m: &StackMember) {
        self.by_key
            .entry((m.owner, m.ustack, m.kstack))
            .or_default()
            .insert(m.member);
    }

    /// Names in `r`, the counts of the processes forked from `r.pid`'s
    /// image under the stack `ids`, the processes that took it (the first
    /// as its pid). Where no record came (they were lost, and counted),
    /// `r` stays as it is.
    pub fn name(&self, r: &mut StackReport, ids: (i32, i32)) {
        let Some(p) = self.by_key.get(&(r.pid, ids.0, ids.1)) else {
            return;
        };
        if let Some(first) = p.set.min() {
            r.pid = first;
        }
        r.processes = p.count();
        // In order, as the bitmap holds them.
        r.pids = p.set.iter().filter(|q| *q != r.pid).collect();
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Interval reports start afresh.
    pub fn clear(&mut self) {
        self.by_key.clear();
    }

    /// Lets go of the keys of owners that are gone and hold no counts
    /// (`kept`: their counts were resolved).
    pub fn forget(&mut self, kept: impl Fn(u32) -> bool) {
        let mut seen: HashMap<u32, bool> = HashMap::new();
        self.by_key
            .retain(|k, _| *seen.entry(k.0).or_insert_with(|| kept(k.0)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(member: u32, owner: u32, ustack: i32) -> StackMember {
        StackMember {
            member,
            owner,
            ustack,
            kstack: -1,
            ..Default::default()
        }
    }

    fn report(pid: u32) -> StackReport {
        StackReport {
            pid,
            processes: 1,
            ..Default::default()
        }
    }

    #[test]
    fn a_row_names_the_processes_that_took_its_key_each_once() {
        let mut m = Members::default();
        for rec in [member(12, 10, 1), member(11, 10, 1), member(12, 10, 1)] {
            m.note(&rec);
        }
        m.note(&member(13, 10, 2));
        let mut r = report(10);
        m.name(&mut r, (1, -1));
        assert_eq!((r.pid, r.processes, r.pids.clone()), (11, 2, vec![12]));
        let mut r = report(10);
        m.name(&mut r, (2, -1));
        assert_eq!((r.pid, r.processes, r.pids.clone()), (13, 1, vec![]));
        // A key no record named stays as it was.
        let mut r = report(10);
        m.name(&mut r, (3, -1));
        assert_eq!((r.pid, r.processes), (10, 1));
        assert_eq!(Pids::of(&r).set.len(), 1);
        m.forget(|pid| pid != 10);
        let mut r = report(10);
        m.name(&mut r, (1, -1));
        assert_eq!(r.processes, 1);
    }

    #[test]
    fn pids_of_a_report_count_the_unnamed_too() {
        let mut r = report(5);
        r.pids = vec![6, 7];
        r.processes = 10;
        let p = Pids::of(&r);
        assert_eq!((p.set.len(), p.more), (3, 7));
    }
}
