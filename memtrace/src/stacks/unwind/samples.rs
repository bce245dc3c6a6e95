//! Unwound samples aggregated by stack: the counting tools' view in dwarf
//! mode, bounded as every count by stack memtrace keeps (`crate::stacks::kept`),
//! with what the unwinder keeps per process let go when it exits.

use std::collections::HashMap;

use memtrace_common::stacks::{StackSample, STACK_SAMPLE_HDR};

use super::{DwarfUnwinder, End};
use crate::stacks::kept::{Kept, StackKeyed, Tally, MAX_KEPT};
use crate::stacks::symbolize::MapsCache;

/// Splits a `kind::STACK_SAMPLE` record into its header and stack bytes.
fn parse_sample(data: &[u8]) -> Option<(StackSample, &[u8])> {
    let hdr: StackSample =
        crate::session::records::record(data, memtrace_common::kind::STACK_SAMPLE)?;
    let stack = data.get(STACK_SAMPLE_HDR..STACK_SAMPLE_HDR + hdr.size as usize)?;
    Some((hdr, stack))
}

/// What samples with the same stack add up to.
#[derive(Debug, Clone, Default)]
pub struct SampleVal {
    pub count: u64,
    /// Sum of the tool's `value` (bytes for brk).
    pub value: u64,
    pub comm: String,
    pub end: Option<End>,
}

impl Tally for SampleVal {
    fn add(&mut self, o: &Self) {
        self.count += o.count;
        self.value += o.value;
        if self.comm.is_empty() {
            self.comm.clone_from(&o.comm);
        }
        if o.end.is_some() {
            self.end = o.end;
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SampleKey {
    pub tgid: u32,
    pub aux: u32,
    pub kstack: i32,
    pub user: Vec<u64>,
    /// The stacks of an exited process, folded into one count.
    pub folded: bool,
}

impl StackKeyed for SampleKey {
    fn tgid(&self) -> u32 {
        self.tgid
    }
    fn folded(&self) -> Option<Self> {
        (!self.folded).then(|| SampleKey {
            tgid: self.tgid,
            aux: self.aux,
            kstack: -1,
            user: Vec::new(),
            folded: true,
        })
    }
}

/// Unwound samples, aggregated by stack.
pub struct DwarfStacks {
    pub unwinder: DwarfUnwinder,
    pub samples: Kept<SampleKey, SampleVal>,
    /// One event in this many was copied.
    pub every: u32,
    /// The tool's stack mode (`stack_mode`), for the reports' notes.
    pub mode: u32,
    /// Each thread's latest unwound stack, for the record that follows it.
    last: HashMap<u32, (Vec<u64>, End)>,
    /// Each process's latest thread to send a stack.
    last_thread: HashMap<u32, u32>,
}

impl DwarfStacks {
    pub fn new(every: u32) -> Self {
        DwarfStacks {
            unwinder: DwarfUnwinder::default(),
            samples: Kept::new(MAX_KEPT),
            every,
            mode: 0,
            last: HashMap::new(),
            last_thread: HashMap::new(),
        }
    }

    /// The stack a thread copied just before its record (`USTACK_IN_SAMPLE`);
    /// by process where the record has no thread id.
    pub fn take_last(&mut self, tgid: u32, tid: Option<u32>) -> Option<(Vec<u64>, End)> {
        let tid = tid.or_else(|| self.last_thread.get(&tgid).copied())?;
        self.last.remove(&tid)
    }

    pub fn add(&mut self, maps: &mut MapsCache, data: &[u8]) {
        let Some((h, stack)) = parse_sample(data) else {
            return;
        };
        let (user, end) = self.unwinder.unwind(maps, &h, stack);
        self.last.insert(h.pid, (user.clone(), end));
        self.last_thread.insert(h.tgid, h.pid);
        let key = SampleKey {
            tgid: h.tgid,
            aux: h.aux,
            kstack: h.kstack,
            user,
            folded: false,
        };
        let v = SampleVal {
            count: 1,
            value: h.value,
            comm: crate::session::records::comm(&h.comm),
            end: (end != End::Complete).then_some(end),
        };
        self.samples.add(key, &v);
    }

    /// What the unwinder and the latest stacks kept for processes and
    /// threads that exited is let go. Their counts stay: they resolve to
    /// rows (`ustack::resolve_exited_samples`), never fold.
    pub fn forget_exited(&mut self, alive: impl Fn(u32) -> bool) {
        self.unwinder.forget_exited(&alive);
        self.last.retain(|t, _| alive(*t));
        self.last_thread.retain(|p, _| alive(*p));
    }

    /// The aggregated samples, emptied with `clear`.
    pub fn take(&mut self, clear: bool) -> Vec<(SampleKey, SampleVal)> {
        if clear {
            self.samples.counts.drain().collect()
        } else {
            self.samples
                .counts
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tgid: u32, user: &[u64]) -> SampleKey {
        SampleKey {
            tgid,
            aux: 1,
            kstack: 5,
            user: user.to_vec(),
            folded: false,
        }
    }

    #[test]
    fn an_exited_process_lets_go_of_its_latest_stacks_but_not_its_counts() {
        let mut d = DwarfStacks::new(1);
        d.samples.max = 1;
        let v = SampleVal {
            count: 3,
            value: 3 * 4096,
            comm: "w".into(),
            end: None,
        };
        d.samples.add(key(1, &[1, 2]), &v);
        d.samples.add(key(2, &[7]), &v);
        d.last.insert(20, (vec![1], End::Complete));
        d.last_thread.insert(2, 20);
        d.forget_exited(|p| p == 1);
        assert!(d.last.is_empty() && d.last_thread.is_empty());
        // Past the bound, nothing folded: counts wait to be resolved.
        assert_eq!(d.samples.folded, 0);
        assert_eq!(d.samples.counts[&key(2, &[7])].count, 3);
        assert_eq!(d.take(true).len(), 2);
        assert!(d.samples.counts.is_empty());
    }
}
