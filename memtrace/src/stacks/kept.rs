//! Counts by (process, stack) kept in memtrace over a long run, bounded.
//! Every new process brings stacks of its own, so such counts grow with
//! every process started (the soak held 175 MiB after two minutes of churn
//! in faults, 156 MiB after ten in brkstack). Past the bound, the
//! per-stack counts of processes that have exited are folded into one count
//! per process: every event stays counted, and the report says which stacks
//! were folded. Shared by the tools that count by stack.

use std::collections::HashMap;
use std::hash::Hash;

use memtrace_common::stacks::{StackKey, StackVal, USTACK_FOLDED};

/// Keys kept before folding, about 100 bytes each.
pub const MAX_KEPT: usize = 65_536;

/// A key of a count by process and stack.
pub trait StackKeyed: Clone + Eq + Hash {
    fn tgid(&self) -> u32;
    /// The key of this process's folded count; None for a key that holds
    /// no stack to fold (a folded count, a count by process).
    fn folded(&self) -> Option<Self>;
}

/// What counts under one key add up to.
pub trait Tally {
    fn add(&mut self, other: &Self);
}

pub struct Kept<K, V> {
    pub counts: HashMap<K, V>,
    /// Per-stack keys folded so far.
    pub folded: u64,
    pub max: usize,
}

impl<K, V> Kept<K, V> {
    /// `stacks_folded` for the summary, when any were.
    pub fn summary(&self) -> Vec<(&'static str, crate::output::Value)> {
        match self.folded {
            0 => Vec::new(),
            n => vec![("stacks_folded", n.into())],
        }
    }

    /// The unwound samples of dwarf mode are kept under the same bound.
    pub fn bound_samples(&self, s: &mut crate::session::Session) {
        if let Some(d) = s.dwarf.as_mut() {
            d.samples.max = self.max;
        }
    }
}

impl<K: StackKeyed, V: Tally + Clone> Kept<K, V> {
    pub fn new(max: usize) -> Self {
        Kept {
            counts: HashMap::new(),
            folded: 0,
            max,
        }
    }

    pub fn add(&mut self, k: K, v: &V) {
        match self.counts.get_mut(&k) {
            Some(e) => e.add(v),
            None => {
                self.counts.insert(k, v.clone());
            }
        }
    }

    /// Folds the stacks of exited processes when over the bound; how many
    /// keys were folded. Whether a process lives is asked once per process.
    pub fn bound(&mut self, alive: impl Fn(u32) -> bool) -> usize {
        if self.counts.len() <= self.max {
            return 0;
        }
        let mut seen: HashMap<u32, bool> = HashMap::new();
        let gone: Vec<K> = self
            .counts
            .keys()
            .filter(|k| k.folded().is_some())
            .filter(|k| !*seen.entry(k.tgid()).or_insert_with(|| alive(k.tgid())))
            .cloned()
            .collect();
        for k in &gone {
            let (Some(v), Some(to)) = (self.counts.remove(k), k.folded()) else {
                continue;
            };
            self.add(to, &v);
        }
        self.folded += gone.len() as u64;
        gone.len()
    }
}

impl StackKeyed for StackKey {
    fn tgid(&self) -> u32 {
        self.tgid
    }
    fn folded(&self) -> Option<Self> {
        (self.ustack != USTACK_FOLDED && (self.ustack >= 0 || self.kstack >= 0)).then_some(
            StackKey {
                tgid: self.tgid,
                ustack: USTACK_FOLDED,
                kstack: -1,
                ustack_check: 0,
            },
        )
    }
}

impl Tally for StackVal {
    fn add(&mut self, o: &Self) {
        self.count += o.count;
        self.bytes += o.bytes;
    }
}

/// A count with the process's name.
impl Tally for (u64, String) {
    fn add(&mut self, o: &Self) {
        self.0 += o.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tgid: u32, ustack: i32) -> StackKey {
        StackKey {
            tgid,
            ustack,
            kstack: -1,
            ustack_check: 7,
        }
    }

    fn val(count: u64) -> StackVal {
        StackVal {
            count,
            bytes: count * 10,
            ..Default::default()
        }
    }

    #[test]
    fn only_the_stacks_of_exited_processes_fold_and_no_count_is_lost() {
        let mut k = Kept::new(4);
        for s in 0..3 {
            k.add(key(1, s), &val(10));
            k.add(key(2, s), &val(5));
        }
        // A key without a stack (counted by process) never folds.
        k.add(key(2, -1), &val(1));
        assert_eq!(k.bound(|tgid| tgid == 1), 3);
        assert_eq!(k.folded, 3);
        assert_eq!(k.counts.len(), 5);
        let folded = &k.counts[&StackKey {
            tgid: 2,
            ustack: USTACK_FOLDED,
            kstack: -1,
            ustack_check: 0,
        }];
        assert_eq!((folded.count, folded.bytes), (15, 150));
        assert_eq!(k.counts[&key(2, -1)].count, 1);
        for s in 0..3 {
            assert_eq!(k.counts[&key(1, s)].count, 10);
        }
        // Folded counts stay as they are on the next round.
        k.max = 1;
        assert_eq!(k.bound(|tgid| tgid == 1), 0);
        // Under the bound nothing moves.
        let mut k = Kept::new(8);
        k.add(key(2, 0), &val(1));
        assert_eq!(k.bound(|_| false), 0);
        assert_eq!(k.folded, 0);
    }
}
