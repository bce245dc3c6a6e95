//! Count maps read by generation (`COUNT_GEN`): programs count into the
//! current generation's keys; a report that clears ends the generation,
//! waits until no program can still add to it, and takes its keys. A key
//! read and deleted while a program adds to it loses the add (about one
//! fault in a 3,000-fault burst, once in 60 runs, before this).

use std::collections::HashMap;
use std::hash::Hash;

use aya::Pod;
use memtrace_common::names::{self, MapName};
use memtrace_common::Generational;

use super::{Fold, Session};
use crate::error::{Error, Result};
use crate::kernel::grace::GracePeriod;

/// The generation programs count in, and what waits out running programs.
pub struct Generations {
    current: u32,
    grace: GracePeriod,
}

impl Generations {
    /// Its maps are made with the others (a tool that drops its
    /// capabilities after attaching could not make them later).
    pub fn new() -> Result<Generations> {
        let grace = GracePeriod::new()
            .map_err(|e| Error::Runtime(format!("creating a map to wait on: {e}")))?;
        Ok(Generations { current: 0, grace })
    }
}

impl Session {
    /// Ends the current generation and returns it: once this returns, no
    /// program adds to its keys (`take_counts` takes them).
    pub fn next_generation(&mut self) -> Result<u32> {
        let old = self.gens.current;
        self.set_array(names::COUNT_GEN, 0, old ^ 1)?;
        self.gens
            .grace
            .wait()
            .map_err(|e| Error::Runtime(format!("waiting for running programs: {e}")))?;
        self.gens.current = old ^ 1;
        Ok(old)
    }

    /// Reads and deletes the keys of an ended generation `gen`.
    pub fn take_counts<K, V>(&mut self, map: MapName<K, V>, gen: u32) -> Result<Vec<(K, V)>>
    where
        K: Pod + Generational + Eq + Hash,
        V: Fold,
    {
        let keys: Vec<K> = self
            .percpu_keys(map)?
            .into_iter()
            .filter(|k| k.gen() == gen)
            .collect();
        Ok(merge(self.take_folded(map, &keys)?))
    }

    /// A generational count map, both generations as one; with `clear`,
    /// what the generation it ends counted (one map's reads).
    pub fn read_counts<K, V>(&mut self, map: MapName<K, V>, clear: bool) -> Result<Vec<(K, V)>>
    where
        K: Pod + Generational + Eq + Hash,
        V: Fold,
    {
        if clear {
            let gen = self.next_generation()?;
            return self.take_counts(map, gen);
        }
        Ok(merge(self.read_folded(map, false)?))
    }
}

/// Keys of both generations as one.
fn merge<K: Generational + Eq + Hash, V: Fold>(read: Vec<(K, V)>) -> Vec<(K, V)> {
    let mut out: HashMap<K, V> = HashMap::with_capacity(read.len());
    for (k, v) in read {
        let k = k.without_gen();
        match out.get_mut(&k) {
            Some(e) => *e = V::fold(&[*e, v]),
            None => {
                out.insert(k, v);
            }
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use memtrace_common::faults::{FaultKey, FaultVal};

    #[test]
    fn both_generations_of_a_key_are_one_count() {
        let k = |gen| FaultKey {
            tgid: 7,
            ustack: 3,
            gen,
            ..Default::default()
        };
        let v = |count| FaultVal {
            count,
            ..Default::default()
        };
        let out = super::merge(vec![
            (k(0), v(2)),
            (k(1), v(5)),
            (FaultKey::default(), v(1)),
        ]);
        assert_eq!(out.len(), 2);
        let seven = out.iter().find(|(k, _)| k.tgid == 7).unwrap();
        assert_eq!((seven.0.gen, seven.1.count), (0, 7));
    }
}
