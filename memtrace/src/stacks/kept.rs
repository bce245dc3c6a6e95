//! Counts by (process, stack) kept in memtrace over a long run, bounded.
//! Every new process brings stacks of its own, so such counts grow with
//! every process started (the soak held 175 MiB after two minutes of churn
//! in faults, 156 MiB after ten in brkstack). Past the bound, the
//! per-stack counts of processes that have exited are symbolized then and
//! kept by what the report shows (name and frames, and pid only with
//! `--per-pid`): churn of identical processes costs one entry per code
//! path, and every event keeps its stack. Only a count whose stack cannot be
//! resolved is folded into one count per process, said in the summary.
//! Shared by the tools that count by stack.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

use memtrace_common::stacks::{StackKey, StackVal, USTACK_FOLDED};

use crate::output::StackReport;
use crate::stacks::members::Pids;

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
    /// Stacks of exited processes, symbolized: by (pid with `--per-pid`,
    /// else 0; name; user frames; kernel frames; note).
    pub resolved: HashMap<Shown, (StackReport, Pids)>,
    /// Keys resolved so far.
    pub resolved_keys: u64,
    pub per_pid: bool,
    /// Processes seen gone at the last `resolve_exited`.
    gone_before: HashSet<u32>,
}

/// A stack as a report shows it.
pub type Shown = (u32, String, Vec<String>, Vec<String>, Option<String>);

/// The frame of the rows of exited processes' stacks past the bound on
/// rows kept (a churn of processes with stacks no two of which are alike).
pub const ROWS_FULL: &str = "[stacks past memtrace's bound on kept rows]";

/// Rows of exited processes' stacks kept (past it, one row per name).
const MAX_ROWS: usize = 1 << 16;

impl<K, V> Kept<K, V> {
    /// `stacks_folded` (and `stacks_resolved`) for the summary, when any were.
    pub fn summary(&self) -> Vec<(&'static str, crate::output::Value)> {
        let mut v = Vec::new();
        if self.folded > 0 {
            v.push(("stacks_folded", self.folded.into()));
        }
        if self.resolved_keys > 0 {
            v.push(("stacks_resolved", self.resolved_keys.into()));
        }
        v
    }

    /// The resolved stacks, emptied with `clear` (interval reports).
    pub fn resolved_reports(&mut self, clear: bool) -> Vec<StackReport> {
        let rows: Vec<(StackReport, Pids)> = match clear {
            true => std::mem::take(&mut self.resolved).into_values().collect(),
            false => self.resolved.values().cloned().collect(),
        };
        rows.into_iter()
            .map(|(mut r, pids)| {
                r.processes = pids.set.len() + pids.more;
                r.pids = pids.set.into_iter().filter(|p| *p != r.pid).collect();
                r
            })
            .collect()
    }

    /// The unwound samples of dwarf mode are kept under the same bound.
    pub fn bound_samples(&self, s: &mut crate::stacks::Traced) {
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
            resolved: HashMap::new(),
            resolved_keys: 0,
            per_pid: false,
            gone_before: HashSet::new(),
        }
    }

    /// Stacks resolved by what they show keep their process apart.
    pub fn per_pid(mut self, per_pid: bool) -> Self {
        self.per_pid = per_pid;
        self
    }

    /// Lets go of the processes named under keys whose owner has exited and
    /// whose counts were all resolved.
    pub fn forget_members(&self, s: &mut crate::stacks::Traced, alive: impl Fn(u32) -> bool) {
        if s.members.is_empty() {
            return;
        }
        let held: HashSet<u32> = self.counts.keys().map(|k| k.tgid()).collect();
        s.members.forget(|pid| held.contains(&pid) || alive(pid));
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
        self.settle(alive, |_, _| None, false)
    }

    /// Resolves the stacks of every process that has exited (`resolve`
    /// symbolizes one, None where it cannot) while memtrace still holds the
    /// process's maps (it lets go of exited processes' maps past a few
    /// thousand), one call after it was first seen gone: the records about
    /// its last mappings may still be on their way. Resolved counts join the
    /// row of what they show; those that cannot be resolved fold into their
    /// process's count once over the bound. How many keys left the
    /// per-process counts.
    pub fn resolve_exited(
        &mut self,
        alive: impl Fn(u32) -> bool,
        resolve: impl FnMut(&K, &V) -> Option<StackReport>,
    ) -> usize {
        self.settle(alive, resolve, true)
    }

    fn settle(
        &mut self,
        alive: impl Fn(u32) -> bool,
        mut resolve: impl FnMut(&K, &V) -> Option<StackReport>,
        defer: bool,
    ) -> usize {
        let over = self.counts.len() > self.max;
        let mut seen: HashMap<u32, bool> = HashMap::new();
        let gone_now: HashSet<u32> = self
            .counts
            .keys()
            .filter(|k| k.folded().is_some())
            .map(|k| k.tgid())
            .filter(|p| !*seen.entry(*p).or_insert_with(|| alive(*p)))
            .collect();
        let ready = match defer {
            true => gone_now.intersection(&self.gone_before).copied().collect(),
            false => gone_now.clone(),
        };
        self.gone_before = gone_now;
        let gone: Vec<K> = self
            .counts
            .keys()
            .filter(|k| k.folded().is_some() && ready.contains(&k.tgid()))
            .cloned()
            .collect();
        let mut folded = 0;
        let resolved_before = self.resolved_keys;
        for k in &gone {
            let (Some(v), Some(to)) = (self.counts.remove(k), k.folded()) else {
                continue;
            };
            let Some(mut r) = resolve(k, &v) else {
                match over {
                    true => {
                        self.add(to, &v);
                        folded += 1;
                    }
                    false => {
                        self.counts.insert(k.clone(), v);
                    }
                }
                continue;
            };
            let pid = if self.per_pid { r.pid } else { 0 };
            // Addresses no file placed (the process was gone before its
            // maps were read) differ from process to process and say
            // nothing: one frame for them, so such stacks merge.
            r.user = crate::stacks::symbolize::placeless(std::mem::take(&mut r.user));
            let mut key = (
                pid,
                r.comm.clone(),
                r.user.clone(),
                r.kernel.clone(),
                r.note.clone(),
            );
            // Rows stay bounded however many distinct stacks (or, with
            // --per-pid, processes) a churn brings: past the bound, one row
            // per name.
            if self.resolved.len() >= MAX_ROWS && !self.resolved.contains_key(&key) {
                r.user = vec![ROWS_FULL.into()];
                r.kernel.clear();
                r.note = None;
                key = (0, r.comm.clone(), r.user.clone(), Vec::new(), None);
            }
            // A process counts once per row, whatever its call sites and
            // however late its last counts were drained.
            match self.resolved.get_mut(&key) {
                Some((e, pids)) => {
                    e.count += r.count;
                    e.bytes = match (e.bytes, r.bytes) {
                        (Some(a), Some(b)) => Some(a + b),
                        (a, b) => a.or(b),
                    };
                    pids.absorb(&r);
                }
                None => {
                    let pids = Pids::of(&r);
                    self.resolved.insert(key, (r, pids));
                }
            }
            self.resolved_keys += 1;
        }
        self.folded += folded;
        (self.resolved_keys - resolved_before + folded) as usize
    }
}

/// A symbolized stack of an exited process, if its frames were found: a
/// stack that could not be read (gone from the stack map, capture failed)
/// has nothing to resolve to.
pub fn resolved(r: StackReport) -> Option<StackReport> {
    (r.note.is_none() && !(r.user.is_empty() && r.kernel.is_empty())).then_some(r)
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
                ..Default::default()
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
            gen: 0,
            forked: 0,
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
            gen: 0,
            forked: 0,
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
