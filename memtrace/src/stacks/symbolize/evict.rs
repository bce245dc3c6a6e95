//! How long the maps of processes that exited are kept: until the tool has
//! resolved their stacks (`forget`), or past a bound on processes kept,
//! oldest first (`keep`).

use std::collections::HashSet;

use super::{MapsCache, MAX_PROCS};

/// Processes forgotten between passes closing the files none maps.
const FORGOTTEN_BEFORE_CLOSING: usize = 1024;

impl MapsCache {
    /// Notes that `pid`'s maps are kept; past MAX_PROCS, lets go of the
    /// oldest processes that have exited (their stacks were reported long
    /// ago, or are lost to a churn nobody could read), and of the files
    /// only they mapped.
    pub(super) fn keep(&mut self, pid: u32) {
        if self.procs.contains_key(&pid) {
            return;
        }
        self.order.push_back(pid);
        if self.procs.len() < MAX_PROCS {
            // Forgotten processes leave their place in the order behind
            // (and a process read again, another): amortized, one pass per
            // as many pushes as there are processes.
            if self.order.len() > 2 * self.procs.len() + 64 {
                let mut seen = HashSet::new();
                let procs = &self.procs;
                self.order
                    .retain(|p| (procs.contains_key(p) || *p == pid) && seen.insert(*p));
            }
            return;
        }
        let mut kept = std::collections::VecDeque::with_capacity(self.order.len());
        let mut over = self.procs.len() + 1 - MAX_PROCS / 2;
        while let Some(p) = self.order.pop_front() {
            if p != pid && !self.procs.contains_key(&p) {
                continue;
            }
            if over > 0 && p != pid && !crate::process::proc::alive(p) {
                self.procs.remove(&p);
                if let Some(kt) = self.ktables.as_mut() {
                    kt.forget(p);
                }
                over -= 1;
            } else {
                kept.push_back(p);
            }
        }
        self.order = kept;
        self.close_unused_files();
    }

    /// Lets go of the maps of processes that have exited and whose stacks
    /// were all resolved to frames: nothing will look them up again. Kept
    /// until the bound instead, a churn's processes held 10 KiB each (their
    /// image and the one before exec), 40 MiB at the bound of 4,096.
    pub fn forget(&mut self, pids: &[u32]) {
        for pid in pids {
            if crate::process::proc::alive(*pid) || self.procs.remove(pid).is_none() {
                continue;
            }
            if let Some(kt) = self.ktables.as_mut() {
                kt.forget(*pid);
            }
            self.forgotten += 1;
        }
        // Their files too, now and then (a pass over every kept mapping).
        if self.forgotten >= FORGOTTEN_BEFORE_CLOSING {
            self.forgotten = 0;
            self.close_unused_files();
        }
    }

    /// Processes that exited: their maps go now where nothing looks them up
    /// after an exit (`keep_exited`), so that a churn of children leaves
    /// their rows' figures and nothing else.
    pub fn exited(&mut self, pids: &[u32]) {
        if self.keep_exited || pids.is_empty() {
            return;
        }
        for pid in pids {
            if self.procs.remove(pid).is_none() {
                continue;
            }
            if let Some(kt) = self.ktables.as_mut() {
                kt.forget(*pid);
            }
            self.forgotten += 1;
        }
        self.pending.retain(|(p, _)| !pids.contains(p));
        if self.forgotten >= FORGOTTEN_BEFORE_CLOSING {
            self.forgotten = 0;
            self.close_unused_files();
        }
    }

    /// Closes the files no kept process maps.
    fn close_unused_files(&mut self) {
        let used: HashSet<_> = self
            .procs
            .values()
            .flat_map(|s| std::iter::once(&s.maps).chain(&s.earlier))
            .flat_map(|m| m.iter().map(|m| (m.dev, m.inode)))
            .collect();
        let held = &self.held;
        self.files
            .retain(|k, _| used.contains(k) || held.contains(k));
    }
}
