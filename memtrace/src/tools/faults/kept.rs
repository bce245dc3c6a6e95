//! What `drain` moved out of the kernel's count map in runs without `-i`,
//! bounded: every new process brings stacks of its own, so counts by
//! (process, stack) grow with every process started (the soak held 175 MiB
//! after two minutes of churn). Past the bound, the per-stack counts of
//! processes that have exited are folded into one count per process: every
//! fault stays counted, and the report says which stacks were folded.

use std::collections::HashMap;

use memtrace_common::{faults::FaultKey, stacks::USTACK_FOLDED};

/// Keys kept before folding, about 100 bytes each.
pub const MAX_KEPT: usize = 65_536;

#[derive(Default)]
pub struct Kept {
    pub counts: HashMap<FaultKey, (u64, String)>,
    /// Per-stack keys folded so far.
    pub folded: u64,
    pub max: usize,
}

impl Kept {
    pub fn new(max: usize) -> Kept {
        Kept {
            max,
            ..Default::default()
        }
    }

    pub fn add(&mut self, k: FaultKey, c: u64, name: String) {
        self.counts.entry(k).or_insert((0, name)).0 += c;
    }

    /// Folds the stacks of exited processes when over the bound.
    pub fn bound(&mut self, alive: impl Fn(u32) -> bool) {
        if self.counts.len() <= self.max {
            return;
        }
        let mut seen: HashMap<u32, bool> = HashMap::new();
        let gone: Vec<FaultKey> = self
            .counts
            .keys()
            .filter(|k| k.ustack != USTACK_FOLDED && (k.ustack >= 0 || k.kstack >= 0))
            .filter(|k| !*seen.entry(k.tgid).or_insert_with(|| alive(k.tgid)))
            .copied()
            .collect();
        for k in gone {
            let Some((c, name)) = self.counts.remove(&k) else {
                continue;
            };
            let to = FaultKey {
                tgid: k.tgid,
                kernel_mode: k.kernel_mode,
                ustack: USTACK_FOLDED,
                kstack: -1,
                ..Default::default()
            };
            self.add(to, c, name);
            self.folded += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tgid: u32, ustack: i32) -> FaultKey {
        FaultKey {
            tgid,
            ustack,
            kstack: -1,
            ..Default::default()
        }
    }

    #[test]
    fn only_the_stacks_of_exited_processes_fold_and_no_count_is_lost() {
        let mut k = Kept::new(4);
        for s in 0..3 {
            k.add(key(1, s), 10, "live".into());
            k.add(key(2, s), 5, "gone".into());
        }
        k.bound(|tgid| tgid == 1);
        assert_eq!(k.folded, 3);
        assert_eq!(k.counts.len(), 4);
        assert_eq!(k.counts[&key(2, USTACK_FOLDED)].0, 15);
        for s in 0..3 {
            assert_eq!(k.counts[&key(1, s)].0, 10);
        }
        // Under the bound nothing moves.
        let mut k = Kept::new(8);
        k.add(key(2, 0), 1, "gone".into());
        k.bound(|_| false);
        assert_eq!(k.folded, 0);
    }
}
