//! Bounded label cardinality: at most `max` keys (processes or cgroups)
//! get series of their own; the others' counts go to one "other" series.
//! Counts are only ever added where they happened, so every series,
//! "other" included, stays monotonic while keys come and go.

use std::collections::HashMap;
use std::hash::Hash;

use crate::probes::snapshot::Figures;

/// A key's series: its counts since it got the series.
#[derive(Clone, Debug, Default)]
pub struct Held {
    pub total: Figures,
    /// The interval it was last active in.
    pub active: u64,
}

pub struct Series<K> {
    pub held: HashMap<K, Held>,
    pub other: Figures,
    pub max: usize,
}

/// A key idle for this many intervals gives its series up to a busier key
/// when none is free: top N by activity, without churning series each time
/// two keys trade places.
pub const IDLE_INTERVALS: u64 = 30;

impl<K: Clone + Eq + Hash + Ord> Series<K> {
    pub fn new(max: usize) -> Series<K> {
        Series {
            held: HashMap::new(),
            other: Figures::default(),
            max,
        }
    }

    /// One interval: `active` holds each key's counts in it (a key may come
    /// more than once); `exists` tells whether a key is still there (gone
    /// keys give their series up).
    pub fn update(&mut self, tick: u64, active: Vec<(K, Figures)>, exists: impl Fn(&K) -> bool) {
        self.held.retain(|k, _| exists(k));
        let mut by_key: HashMap<K, Figures> = HashMap::new();
        for (k, f) in active {
            by_key.entry(k).or_default().add(&f);
        }
        let mut waiting: Vec<(K, Figures)> = Vec::new();
        for (k, f) in by_key {
            match self.held.get_mut(&k) {
                Some(h) => {
                    h.total.add(&f);
                    if f.activity() > 0 {
                        h.active = tick;
                    }
                }
                None => waiting.push((k, f)),
            }
        }
        // Busiest first; ties by key, so the choice is the same every run.
        waiting.sort_by(|a, b| {
            b.1.activity()
                .cmp(&a.1.activity())
                .then_with(|| a.0.cmp(&b.0))
        });
        let mut idle: Vec<(u64, K)> = self
            .held
            .iter()
            .filter(|(_, h)| tick.saturating_sub(h.active) >= IDLE_INTERVALS)
            .map(|(k, h)| (h.active, k.clone()))
            .collect();
        idle.sort();
        let mut idle = idle.into_iter();
        for (k, f) in waiting {
            let room = self.held.len() < self.max
                || (f.activity() > 0
                    && idle
                        .next()
                        .is_some_and(|(_, old)| self.held.remove(&old).is_some()));
            if room && f.activity() > 0 {
                self.held.insert(
                    k,
                    Held {
                        total: f,
                        active: tick,
                    },
                );
            } else {
                self.other.add(&f);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn faults(n: u64) -> Figures {
        Figures {
            faults_user: n,
            ..Default::default()
        }
    }

    #[test]
    fn never_more_than_max_and_nothing_lost() {
        let mut s: Series<u32> = Series::new(3);
        let mut sum = 0;
        for tick in 1..50u64 {
            let active: Vec<(u32, Figures)> = (0..10)
                .map(|i| ((tick as u32) * 100 + i, faults(i as u64 + 1)))
                .collect();
            sum += active.iter().map(|a| a.1.faults_user).sum::<u64>();
            // Every key lives one interval: short-lived processes.
            s.update(tick, active, |k| *k / 100 == tick as u32);
            assert!(s.held.len() <= 3);
        }
        let shown: u64 = s.held.values().map(|h| h.total.faults_user).sum();
        // Keys gone take their series (and counts) with them; the last
        // interval's three busiest are held, the rest went to "other".
        assert_eq!(shown, 10 + 9 + 8);
        assert!(s.other.faults_user > 0 && s.other.faults_user < sum);
    }

    #[test]
    fn other_is_monotonic_and_busiest_get_series() {
        let mut s: Series<u32> = Series::new(2);
        s.update(
            1,
            vec![(1, faults(5)), (2, faults(1)), (3, faults(9))],
            |_| true,
        );
        assert!(s.held.contains_key(&3) && s.held.contains_key(&1));
        assert_eq!(s.other.faults_user, 1);
        let before = s.other.faults_user;
        s.update(2, vec![(2, faults(4))], |_| true);
        assert!(s.other.faults_user >= before);
        assert_eq!(s.other.faults_user, 5);
        // Idle long enough, 1 and 3 make room for 2.
        s.update(1 + IDLE_INTERVALS, vec![(2, faults(1))], |_| true);
        assert!(s.held.contains_key(&2));
        assert_eq!(s.held.len(), 2);
    }
}
