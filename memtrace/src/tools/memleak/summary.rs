//! memleak's summary: what it counted, and what it could not follow.

use memtrace_common::memleak::counter;

use super::Memleak;
use crate::output::Value;

impl Memleak {
    pub(super) fn summary_rows(&self) -> Vec<(&'static str, Value)> {
        let n = |i: u32| self.counts[i as usize];
        let c = |i: u32| Value::from(n(i));
        // A batched free found no block and then its block came in
        // another thread's batch: tracked after all.
        let untracked = n(counter::FREE_UNKNOWN).saturating_sub(n(counter::FREED_EARLY));
        let mut v = vec![
            ("allocations", c(counter::ALLOCS)),
            ("frees", c(counter::FREES)),
            ("frees_untracked", Value::from(untracked)),
        ];
        if self.memo.is_some() {
            v.push(("allocations_from_memo", c(counter::MEMOIZED)));
            v.push(("allocations_in_batches", Value::from(self.pending_allocs)));
        }
        if self.preload.is_some() || self.injection.is_some() {
            v.push(("frees_in_batches", Value::from(self.pending_frees)));
        }
        if self.preload.is_some() {
            v.push(("preloaded_processes", c(counter::PRELOADED)));
            v.push(("children_unpreloaded", c(counter::UNPRELOADED)));
        } else if self.user {
            v.push(("pending_collisions", c(counter::PENDING_COLLISION)));
        }
        if self.args.sample_bytes.is_some() {
            v.push(("not_sampled", c(counter::UNSAMPLED)));
        }
        if self.args.min_size.is_some() || self.args.max_size.is_some() {
            v.push(("out_of_bounds", c(counter::OUT_OF_BOUNDS)));
        }
        if self.user {
            v.push(("blocks_gone_with_exec", Value::from(self.execs.blocks())));
        }
        if self.left.0 > 0 {
            v.push(("arena_mappings_left_out", Value::from(self.left.0)));
            v.push(("arena_bytes_left_out", Value::from(self.left.1)));
        }
        v.extend(self.go.summary());
        v.extend(self.exited.summary());
        v.extend(self.injection.iter().flat_map(|i| i.summary()));
        v
    }
}
