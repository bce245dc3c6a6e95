//! User mode: what the kernel keeps for processes that exited. Following a
//! command that starts process after process (a shell loop, a build), each
//! one's stacks and the blocks it never freed stayed in the kernel's tables
//! until they filled (27 M allocations lost in a 10-minute soak). A
//! process's totals by stack move here when it is gone, under the shared
//! bound on kept counts, and are reported as held when it exited; its
//! blocks are swept out of the table of live allocations.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use memtrace_common::{memleak::AllocStats, stacks::StackKey};

use super::report::{without_shim, Tables, HELD_AT_EXIT};
use crate::error::Result;
use crate::output::{AllocFigures, Value};
use crate::stacks::kept::{resolved, Kept, Tally};
use crate::stacks::ustack::stack_report;
use crate::stacks::Traced;

impl Tally for AllocStats {
    fn add(&mut self, o: &Self) {
        self.allocs += o.allocs;
        self.bytes += o.bytes;
        self.frees += o.frees;
        self.freed_bytes += o.freed_bytes;
        if self.comm[0] == 0 {
            self.comm = o.comm;
        }
    }
}

pub struct Exited {
    /// Totals by stack of processes that exited.
    pub kept: Kept<StackKey, AllocStats>,
    processes: u64,
    /// Allocations (and bytes) still held when their process exited.
    held: (u64, u64),
    /// Their entries taken out of the table of live allocations.
    swept: u64,
    /// Processes whose blocks are still to be swept.
    sweep: HashSet<u32>,
    next_sweep: Instant,
}

/// A sweep reads the whole table of live allocations (a million entries
/// take about a second): the next waits this many times as long.
const SWEEP_PACE: u32 = 20;

impl Exited {
    pub fn new(max_kept: usize) -> Exited {
        Exited {
            kept: Kept::new(max_kept),
            processes: 0,
            held: (0, 0),
            swept: 0,
            sweep: HashSet::new(),
            next_sweep: Instant::now(),
        }
    }

    /// Moves the totals of processes that exited out of the kernel's map,
    /// and sweeps their blocks when due; how many keys moved.
    pub fn reclaim(&mut self, s: &mut Traced, t: Tables, target: Option<u32>) -> Result<usize> {
        let mut alive: HashMap<u32, bool> = HashMap::new();
        let gone: Vec<StackKey> = s
            .percpu_keys(t.stacks)?
            .into_iter()
            .filter(|k| Some(k.tgid) != target)
            .filter(|k| {
                !*alive
                    .entry(k.tgid)
                    .or_insert_with(|| crate::process::proc::alive(k.tgid))
            })
            .collect();
        self.processes += alive.values().filter(|a| !**a).count() as u64;
        let moved = s.take_folded(t.stacks, &gone)?;
        for (k, v) in &moved {
            let n = v.allocs.saturating_sub(v.frees);
            if n > 0 {
                self.held.0 += n;
                self.held.1 += v.bytes.saturating_sub(v.freed_bytes);
                self.sweep.insert(k.tgid);
            }
            self.kept.add(*k, v);
        }
        self.kept.bound(crate::process::proc::alive);
        if !self.sweep.is_empty() && Instant::now() >= self.next_sweep {
            let began = Instant::now();
            let dead: Vec<_> = s
                .hash_keys(t.allocs)
                .into_iter()
                .filter(|k| self.sweep.contains(&k.tgid))
                .collect();
            for k in &dead {
                s.hash_remove(t.allocs, k)?;
            }
            self.swept += dead.len() as u64;
            self.sweep.clear();
            self.next_sweep = Instant::now() + began.elapsed() * SWEEP_PACE;
        }
        Ok(moved.len())
    }

    /// Symbolizes the stacks of processes gone since the last round into
    /// rows by what they show (memleak's report), what each held at exit
    /// and its figures, and lets go of their walked stacks. Kept by process
    /// and stack, a churn of processes kept every walked stack until the
    /// bound on kept counts: memleak grew 5 MiB a minute in the soak
    /// (36,792 stacks kept after 5 minutes, 1,985 processes), and past the
    /// bound a process's stacks folded into one faceless count. `figures`
    /// carries the view's flags; `execd` what went with execs.
    pub fn resolve(
        &mut self,
        s: &mut Traced,
        mode: u32,
        figures: AllocFigures,
        execd: &HashMap<StackKey, (u64, u64)>,
    ) {
        self.kept
            .resolve_exited(crate::process::proc::alive, |k, v| {
                let (gn, gb) = execd.get(k).copied().unwrap_or_default();
                let n = v.allocs.saturating_sub(v.frees + gn);
                let b = v.bytes.saturating_sub(v.freed_bytes + gb);
                let comm = crate::session::records::comm(&v.comm);
                let ids = (k.ustack, k.ustack_check, k.kstack);
                let mut r = stack_report(s, k.tgid, comm, ids, mode, n, Some(b));
                without_shim(&mut r);
                let mut r = resolved(r)?;
                // A stack that could not be read says why instead.
                r.note.get_or_insert_with(|| HELD_AT_EXIT.into());
                r.alloc = Some(AllocFigures {
                    allocs: v.allocs,
                    bytes: v.bytes,
                    frees: v.frees,
                    freed_bytes: v.freed_bytes,
                    ..figures
                });
                Some(r)
            });
        self.kept.settle_stacks(&mut s.stacks);
        self.kept.forget_maps(&s.sym.maps);
    }

    pub fn summary(&self) -> Vec<(&'static str, Value)> {
        if self.processes == 0 {
            return Vec::new();
        }
        let mut v = vec![
            ("exited_processes", self.processes.into()),
            ("held_at_exit", self.held.0.into()),
            ("held_at_exit_bytes", self.held.1.into()),
            ("exited_blocks_swept", self.swept.into()),
        ];
        v.extend(self.kept.summary());
        v
    }
}
