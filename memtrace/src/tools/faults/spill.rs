//! Faults the kernel counted while its count map was full: a burst of new
//! processes between two drains, while memtrace waited for a CPU. By
//! stack, each process's are counted in a slot of its own and reported as
//! one row of that process without its stacks (`USTACK_SPILLED`); those
//! of a process whose slot another held (`FAULT_SPILL`) on a line of their
//! own, without process or stack. Both are said in the summary as
//! `count_spilled` (a degradation).

use memtrace_common::{faults::FaultKey, names::FAULT_SPILL};

use crate::error::Result;
use crate::stacks::Traced;

/// The name on their line.
pub const NAME: &str = "[count map full]";
pub const NOTE: &str = "counted while the count map was full: no process or stack (raise --keys)";
pub const NOTE_BY_PROCESS: &str = "counted while the count map was full: no stack (raise --keys)";

#[derive(Default)]
pub struct Spill {
    /// The kernel's totals, by mode, at the last clearing read.
    seen: [u64; 2],
}

impl Spill {
    /// What was spilled since the last clearing read, by mode.
    pub fn read(&mut self, s: &Traced, clear: bool) -> Result<Vec<(FaultKey, u64, String)>> {
        let mut out = Vec::new();
        for (mode, per_cpu) in s.read_percpu_array(FAULT_SPILL)?.iter().enumerate().take(2) {
            let total: u64 = per_cpu.iter().sum();
            let n = total - self.seen[mode].min(total);
            if clear {
                self.seen[mode] = total;
            }
            if n > 0 {
                let key = FaultKey {
                    tgid: 0,
                    kernel_mode: mode as u8,
                    ustack: -1,
                    kstack: -1,
                    ..Default::default()
                };
                out.push((key, n, NAME.to_string()));
            }
        }
        Ok(out)
    }
}
