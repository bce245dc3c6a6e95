//! faults' count-by-process slots: a direct-mapped per-CPU array the
//! kernel adds to, read without ever being zeroed from here.

use std::collections::{HashMap, HashSet};

use memtrace_common::names::{FAULT_SLOTS, FAULT_SLOT_FREE};

use crate::error::Result;
use crate::process::proc::alive;
use crate::session::records::comm;
use crate::stacks::Traced;

/// What the count-by-process slots (see `FaultSlot`) held at the last read.
#[derive(Default)]
pub(super) struct Slots {
    /// Per slot and CPU: its process and counts.
    pub(super) last: HashMap<(u32, usize), (u32, [u64; 2])>,
    /// Counts read since the last report, by process.
    pub(super) pending: HashMap<u32, ([u64; 2], String)>,
    /// Slots whose process was found gone at the last read.
    pub(super) gone: HashSet<(u32, u32)>,
}

impl Slots {
    /// Adds what each slot counted since the last read. Slots are never
    /// zeroed from here (a plain write would race the kernel's adds): a
    /// process's slot is given up only one read after it was found gone,
    /// when its counts can no longer move.
    pub(super) fn read(&mut self, s: &mut Traced) -> Result<()> {
        let slots = s.read_percpu_array(FAULT_SLOTS)?;
        let mut held: HashSet<(u32, u32)> = HashSet::new();
        for (i, per_cpu) in slots.iter().enumerate() {
            for (cpu, v) in per_cpu.iter().enumerate() {
                if v.tgid == 0 {
                    continue;
                }
                let before = match self.last.insert((i as u32, cpu), (v.tgid, v.count)) {
                    Some((t, c)) if t == v.tgid => c,
                    // New, or taken over from a process already read out.
                    _ => [0, 0],
                };
                let e = self
                    .pending
                    .entry(v.tgid)
                    .or_insert_with(|| ([0, 0], comm(&v.comm)));
                for ((sum, now), then) in e.0.iter_mut().zip(v.count).zip(before) {
                    *sum += now.saturating_sub(then);
                }
                held.insert((i as u32, v.tgid));
            }
        }
        let mut gone = HashSet::new();
        for (i, tgid) in held {
            if alive(tgid) {
                continue;
            }
            if self.gone.contains(&(i, tgid)) {
                s.set_array(FAULT_SLOT_FREE, i, tgid)?;
            } else {
                gone.insert((i, tgid));
            }
        }
        self.gone = gone;
        Ok(())
    }
}
