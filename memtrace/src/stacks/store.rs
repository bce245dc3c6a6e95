//! Walked user stacks moved out of the kernel's map as they arrive. Every
//! new process brings stacks at addresses of its own, so a long run meets
//! far more stacks than USTACKS holds (it filled after about a hundred
//! processes, and every later stack failed); memtrace keeps them here,
//! bounded, and the map only holds what arrived since the last harvest.

use memtrace_common::stacks::{ustack_key, ustack_key_parts, UserStack};
use std::cell::Cell;
use std::collections::HashMap;

use super::Traced;
use crate::error::Result;

/// Stacks kept: a few dozen bytes plus 8 per frame each, so some MiB at
/// most. Past it the least recently seen go first.
const MAX_KEPT: usize = 65_536;

/// How long work in the event loop may go without a harvest.
const KEEP_UP_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

#[derive(Default)]
pub struct StackStore {
    /// By key (`ustack_key`): id and check, so two stacks under one id
    /// are kept apart.
    kept: HashMap<u64, Kept>,
    /// The check of the stack kept last under each id, for records that
    /// carry the id alone.
    latest: HashMap<u32, u32>,
    /// Orders uses: the larger, the more recent.
    clock: Cell<u64>,
    /// Stacks let go under the bound.
    pub evicted: u64,
    /// Stacks let go once no count named them.
    pub released: u64,
    /// Ids looked up that were in neither the kernel's map nor here: a
    /// report line without its stack.
    pub missed: Cell<u64>,
    max: usize,
    /// The clock when kept counts last said which stacks they name
    /// (`settled`).
    settled_at: u64,
}

struct Kept {
    hash: u64,
    ips: Box<[u64]>,
    used: Cell<u64>,
    /// When the kernel last sent it (for a new key of it).
    sent: u64,
}

impl StackStore {
    pub fn new() -> StackStore {
        StackStore {
            max: MAX_KEPT,
            ..Default::default()
        }
    }

    fn now(&self) -> u64 {
        let t = self.clock.get() + 1;
        self.clock.set(t);
        t
    }

    pub(super) fn keep(&mut self, key: u64, s: &UserStack) {
        let now = self.now();
        let (id, check) = ustack_key_parts(key);
        self.latest.insert(id, check);
        match self.kept.get_mut(&key) {
            // A stack comes back each time a key of it is new again.
            Some(k) if k.hash == s.hash => {
                k.used.set(now);
                k.sent = now;
            }
            // A new stack, or another one under a key that was freed.
            _ => {
                let nr = (s.nr as usize).min(s.ips.len());
                let k = Kept {
                    hash: s.hash,
                    ips: s.ips[..nr].into(),
                    used: Cell::new(now),
                    sent: now,
                };
                self.kept.insert(key, k);
                // Bounded as stacks come, not after a harvest: one harvest
                // can bring more than the bound, and the table grown for it
                // (262k buckets in a Python churn) never shrinks.
                self.bound();
            }
        }
    }

    /// Lets the least recently seen quarter go when over the bound: once
    /// per quarter of the bound, not per stack.
    fn bound(&mut self) {
        if self.kept.len() <= self.max {
            return;
        }
        let keep = self.max * 3 / 4;
        let mut used: Vec<u64> = self.kept.values().map(|k| k.used.get()).collect();
        let drop = used.len() - keep;
        let (_, cut, _) = used.select_nth_unstable(drop - 1);
        let cut = *cut;
        let before = self.kept.len();
        self.kept.retain(|_, k| k.used.get() > cut);
        self.evicted += (before - self.kept.len()) as u64;
        let kept = &self.kept;
        self.latest
            .retain(|id, check| kept.contains_key(&ustack_key(*id as i32, *check)));
    }

    /// The key of the stack `id` and `check` name: the check as a count's
    /// key holds it (the whole of it, or its low 16 bits in a fault's
    /// key), or 0 for a record that carries the id alone (the stack kept
    /// under the id last).
    fn find(&self, id: u32, check: u32) -> Option<u64> {
        let key = ustack_key(id as i32, check);
        if check != 0 && self.kept.contains_key(&key) {
            return Some(key);
        }
        let last = *self.latest.get(&id)?;
        let agrees = check == 0 || (check <= 0xffff && last & 0xffff == check);
        agrees.then(|| ustack_key(id as i32, last))
    }

    /// `get` without counting a miss (the caller looks again).
    pub fn peek(&self, id: u32, check: u32) -> Option<Vec<u64>> {
        let k = self.kept.get(&self.find(id, check)?)?;
        k.used.set(self.now());
        Some(k.ips.to_vec())
    }

    /// Instruction pointers of a harvested stack, innermost first.
    pub fn get(&self, id: u32, check: u32) -> Option<Vec<u64>> {
        match self.find(id, check).and_then(|k| self.kept.get(&k)) {
            Some(k) => {
                k.used.set(self.now());
                Some(k.ips.to_vec())
            }
            None => {
                self.missed.set(self.missed.get() + 1);
                None
            }
        }
    }

    pub fn kept(&self) -> usize {
        self.kept.len()
    }

    /// Lets a stack go that no count names any more (its processes'
    /// counts were resolved to frames). The kernel sends a stack again with
    /// each new key of it, so a later count of it finds it; one sent again
    /// since the last `settled` (harvested while a round resolved) is for a
    /// key still in the kernel's maps, and stays.
    pub fn release(&mut self, id: u32, check: u32) {
        let Some(key) = self.find(id, check) else {
            return;
        };
        if self
            .kept
            .get(&key)
            .is_some_and(|k| k.sent <= self.settled_at)
        {
            self.kept.remove(&key);
            if self.latest.get(&id) == Some(&ustack_key_parts(key).1) {
                self.latest.remove(&id);
            }
            self.released += 1;
        }
    }

    /// Kept counts have said which stacks they name: what arrives from now
    /// on is for keys not drained yet.
    pub fn settled(&mut self) {
        self.settled_at = self.now();
        // The table keeps the room of its fullest moment (a burst of new
        // processes) once most stacks are let go: given back.
        if self.kept.capacity() > 4 * self.kept.len() + 4096 {
            self.kept.shrink_to(2 * self.kept.len());
            self.latest.shrink_to(2 * self.latest.len());
        }
    }

    /// Marks a stack as in use (counts of a live process still name it),
    /// so the bound lets others go first: counts of long-lived processes
    /// otherwise lost their stacks by the final report on a churning host.
    pub fn touch(&self, id: u32, check: u32) {
        if let Some(k) = self.find(id, check).and_then(|k| self.kept.get(&k)) {
            k.used.set(self.now());
        }
    }
}

impl Traced {
    /// Moves the walked user stacks that arrived since the last call out
    /// of the kernel's map into the store; how many.
    pub fn harvest_user_stacks(&mut self) -> Result<usize> {
        if !self.walked_user_stacks {
            return Ok(0);
        }
        self.harvested = std::time::Instant::now();
        let stacks = &mut self.stacks;
        let mut python = Vec::new();
        let n = self.session.take_user_stacks(|key, s| {
            stacks.keep(key, s);
            let nr = (s.nr as usize).min(s.ips.len());
            if let (_, Some(py)) = crate::stacks::python::split(&s.ips[..nr]) {
                python.push(py);
            }
        })?;
        // Their code objects, while the processes are there to read.
        for py in &python {
            let types = self.sym.python_types(py.tgid);
            self.sym.python.learn(py, types);
        }
        Ok(n)
    }

    /// Harvests in the middle of long work (symbolizing a round of exited
    /// processes' stacks): the kernel's store fills in tens of milliseconds
    /// on a busy host. A round that resolved 15 Python processes at once
    /// cost memleak 137,972 stacks; a time budget on rounds instead let a
    /// churn's backlog grow without end (`faults --stacks`: 387 MiB and
    /// 1.9 M stack_evicted in 2 minutes).
    pub fn keep_up(&mut self) {
        if self.harvested.elapsed() >= KEEP_UP_EVERY {
            // A failed read shows at the next tick's harvest, which returns it.
            let _ = self.harvest_user_stacks();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memtrace_common::stacks::MAX_UFRAMES;

    fn key(id: u32) -> u64 {
        ustack_key(id as i32, 1)
    }

    fn stack(hash: u64, ips: &[u64]) -> UserStack {
        let mut s = UserStack {
            hash,
            nr: ips.len() as u32,
            _pad: 0,
            ips: [0; MAX_UFRAMES],
        };
        s.ips[..ips.len()].copy_from_slice(ips);
        s
    }

    #[test]
    fn the_least_recently_seen_go_first_and_are_counted() {
        let mut st = StackStore::new();
        st.max = 8;
        for id in 0..8 {
            st.keep(key(id), &stack(id as u64, &[id as u64, 1]));
        }
        // Stack 0 is looked at, stack 1 comes back: both recent now.
        assert_eq!(st.get(0, 1), Some(vec![0, 1]));
        st.keep(key(1), &stack(1, &[1, 1]));
        st.keep(key(8), &stack(8, &[8]));
        assert_eq!(st.kept(), 6);
        assert_eq!(st.evicted, 3);
        for gone in [2, 3, 4] {
            assert_eq!(st.get(gone, 1), None, "{gone}");
        }
        assert_eq!(st.missed.get(), 3);
        for kept in [0, 1, 5, 6, 7, 8] {
            assert!(st.get(kept, 1).is_some(), "{kept}");
        }
    }

    #[test]
    fn a_stack_sent_again_since_the_last_settle_is_not_let_go() {
        let mut st = StackStore::new();
        st.keep(key(1), &stack(1, &[10]));
        st.keep(key(2), &stack(2, &[20]));
        st.settled();
        // Harvested while a round resolved: a new key of stack 2 waits in
        // the kernel's count map.
        st.keep(key(2), &stack(2, &[20]));
        st.release(1, 1);
        st.release(2, 1);
        assert_eq!(st.released, 1);
        assert_eq!(st.get(1, 1), None);
        assert_eq!(st.get(2, 1), Some(vec![20]));
        // Named by no kept count at the next settle: let go then.
        st.settled();
        st.release(2, 1);
        assert_eq!(st.get(2, 1), None);
    }

    #[test]
    fn another_stack_under_a_freed_id_replaces_the_old_one() {
        let mut st = StackStore::new();
        st.keep(key(5), &stack(1, &[10, 11]));
        st.keep(key(5), &stack(1, &[10, 11]));
        assert_eq!(st.get(5, 1), Some(vec![10, 11]));
        st.keep(key(5), &stack(2, &[20]));
        assert_eq!(st.get(5, 1), Some(vec![20]));
    }

    #[test]
    fn two_stacks_under_one_id_are_told_apart_by_their_check() {
        let mut st = StackStore::new();
        st.keep(ustack_key(7, 0x1_0003), &stack(1, &[10]));
        st.keep(ustack_key(7, 0x2_0005), &stack(2, &[20]));
        assert_eq!(st.get(7, 0x1_0003), Some(vec![10]));
        assert_eq!(st.get(7, 0x2_0005), Some(vec![20]));
        // A fault's key holds the check's low 16 bits; a record, none:
        // the stack kept last under the id.
        assert_eq!(st.get(7, 0x0005), Some(vec![20]));
        assert_eq!(st.get(7, 0), Some(vec![20]));
        // Neither stack: no frames rather than another stack's.
        assert_eq!(st.get(7, 0x3_0007), None);
        assert_eq!(st.get(7, 0x0003), None);
        assert_eq!(st.kept(), 2);
    }
}
