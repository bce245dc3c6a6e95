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

use crate::output::{AllocFigures, StackReport};
use crate::stacks::members::Pids;

/// Keys kept before folding, about 100 bytes each.
pub const MAX_KEPT: usize = 65_536;

/// A key of a count by process and stack.
pub trait StackKeyed: Clone + Eq + Hash {
    fn tgid(&self) -> u32;
    /// The key of this process's folded count; None for a key that holds
    /// no stack to fold (a folded count, a count by process).
    fn folded(&self) -> Option<Self>;
    /// The id and check of its walked user stack in the store, if it has
    /// one.
    fn walked(&self) -> Option<(u32, u32)> {
        None
    }
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
    /// Stacks of exited processes, symbolized, by what the report shows,
    /// with what they add up to.
    resolved: HashMap<Row, Tallied>,
    /// Keys resolved so far.
    pub resolved_keys: u64,
    pub per_pid: bool,
    /// Processes seen gone at the last `resolve_exited`.
    gone_before: HashSet<u32>,
    /// Walked stacks of keys resolved since the last `settle_stacks`.
    done_stacks: Vec<(u32, u32)>,
    /// Exited processes whose stacks were all resolved since the last
    /// `forget_maps`.
    done_pids: Vec<u32>,
}

/// A row of exited processes' stacks, hashed and compared on what a
/// report shows (pid with `--per-pid`, else 0; name; user and kernel
/// frames; note). The frames are held once: a key of its own copy of them
/// doubled the rows' memory, most of `faults --stacks`' heap under a churn.
#[derive(Clone)]
struct Row {
    pid: u32,
    r: StackReport,
}

impl PartialEq for Row {
    fn eq(&self, o: &Row) -> bool {
        self.r.shown(self.pid) == o.r.shown(o.pid)
    }
}

impl Eq for Row {}

impl Hash for Row {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.r.shown(self.pid).hash(h)
    }
}

/// A row's count, bytes, processes and allocation figures (the row's own
/// report holds those of its first stack).
type Tallied = (u64, Option<u64>, Pids, Option<AllocFigures>);

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
        let rows: Vec<(Row, Tallied)> = match clear {
            true => std::mem::take(&mut self.resolved).into_iter().collect(),
            false => self
                .resolved
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        rows.into_iter()
            .map(|(row, (count, bytes, pids, alloc))| {
                let mut r = row.r;
                r.count = count;
                r.bytes = bytes;
                r.alloc = alloc;
                r.processes = pids.count();
                r.pids = pids.set.into_iter().filter(|p| *p != r.pid).collect();
                r
            })
            .collect()
    }

    /// Tells the store of walked stacks which are still named by kept
    /// counts (in use: let go last) and which only resolved keys named (let
    /// go now). Exited processes' stacks otherwise stayed until the store's
    /// bound pushed them out: 50,000 kept (most of a KiB each) under a
    /// churn of Python processes, 690,000 let go in 30 s.
    pub fn settle_stacks(&mut self, store: &mut crate::stacks::store::StackStore)
    where
        K: StackKeyed,
    {
        let named: HashSet<(u32, u32)> = self.counts.keys().filter_map(|k| k.walked()).collect();
        for &(id, check) in &named {
            store.touch(id, check);
        }
        for (id, check) in self.done_stacks.drain(..) {
            if !named.contains(&(id, check)) {
                store.release(id, check);
            }
        }
        store.settled();
    }

    /// Lets go of the maps of exited processes whose stacks were all
    /// resolved: nothing looks them up again.
    pub fn forget_maps(&mut self, maps: &crate::stacks::symbolize::SharedMaps) {
        if !self.done_pids.is_empty() {
            maps.lock()
                .unwrap()
                .forget(&std::mem::take(&mut self.done_pids));
        }
    }

    /// The unwound samples of dwarf mode resolve to rows the same way
    /// (per process with --per-pid).
    pub fn share_with_samples(&self, s: &mut crate::stacks::Traced) {
        if let Some(d) = s.dwarf.as_mut() {
            d.samples.per_pid = self.per_pid;
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
            done_stacks: Vec::new(),
            done_pids: Vec::new(),
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
            self.done_stacks.extend(k.walked());
            let pid = if self.per_pid { r.pid } else { 0 };
            // Addresses no file placed (the process was gone before its
            // maps were read) differ from process to process and say
            // nothing: one frame for them, so such stacks merge.
            r.user = crate::stacks::symbolize::text::placeless(std::mem::take(&mut r.user));
            let mut row = Row { pid, r };
            // Rows stay bounded however many distinct stacks (or, with
            // --per-pid, processes) a churn brings: past the bound, one row
            // per name.
            if self.resolved.len() >= MAX_ROWS && !self.resolved.contains_key(&row) {
                row.pid = 0;
                row.r.user = vec![ROWS_FULL.into()];
                row.r.kernel.clear();
                row.r.note = None;
            }
            // A process counts once per row, whatever its call sites and
            // however late its last counts were drained.
            match self.resolved.get_mut(&row) {
                Some((count, bytes, pids, alloc)) => {
                    *count += row.r.count;
                    *bytes = match (*bytes, row.r.bytes) {
                        (Some(a), Some(b)) => Some(a + b),
                        (a, b) => a.or(b),
                    };
                    pids.absorb(&row.r);
                    if let (Some(a), Some(b)) = (alloc, &row.r.alloc) {
                        a.add(b);
                    }
                }
                None => {
                    let t = (row.r.count, row.r.bytes, Pids::of(&row.r), row.r.alloc);
                    self.resolved.insert(row, t);
                }
            }
            self.resolved_keys += 1;
        }
        self.folded += folded;
        // A map keeps the room of its largest round (7 MB of `faults
        // --stacks`' heap holding a few thousand keys): given back.
        if self.counts.capacity() > 4 * self.counts.len() + 4096 {
            self.counts.shrink_to(2 * self.counts.len());
        }
        if defer && !ready.is_empty() {
            let left: HashSet<u32> = self
                .counts
                .keys()
                .filter(|k| k.folded().is_some())
                .map(|k| k.tgid())
                .collect();
            self.done_pids
                .extend(ready.iter().filter(|p| !left.contains(p)));
        }
        (self.resolved_keys - resolved_before + folded) as usize
    }
}

/// A symbolized stack of an exited process as a row. One that could not be
/// read (gone from the stack map, capture failed) never will be: it keeps
/// the note that says why and joins its name's row of that note. Kept for
/// a later round instead, it was looked up again every round and counted
/// lost each time (16,340 stack_evicted a round, in one run under churn).
pub fn resolved(mut r: StackReport) -> Option<StackReport> {
    if r.note.is_none() && r.user.is_empty() && r.kernel.is_empty() {
        r.note = Some("stack not found".into());
    }
    Some(r)
}

impl StackKeyed for StackKey {
    fn tgid(&self) -> u32 {
        self.tgid
    }
    fn walked(&self) -> Option<(u32, u32)> {
        (self.ustack >= 0).then_some((self.ustack as u32, self.ustack_check))
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
mod tests;
