//! What is outstanding, by stack: from the per-stack totals, or from the
//! live allocations themselves when they are filtered by age or phase.

use std::collections::HashMap;

use memtrace_common::{
    memleak::{origin, AllocInfo, AllocKey, AllocStats},
    names::{MapName, ML_ALLOCS, ML_KALLOCS, ML_KSTACKS, ML_STACKS},
    stacks::StackKey,
};

/// The maps of one mode: user (lazily allocated) or kernel (preallocated).
#[derive(Clone, Copy)]
pub struct Tables {
    pub allocs: MapName<AllocKey, AllocInfo>,
    pub stacks: MapName<StackKey, AllocStats>,
}

pub const USER: Tables = Tables {
    allocs: ML_ALLOCS,
    stacks: ML_STACKS,
};
pub const KERNEL: Tables = Tables {
    allocs: ML_KALLOCS,
    stacks: ML_KSTACKS,
};

use crate::error::Result;
use crate::output::{AllocFigures, Shown, StackReport};
use crate::session::{first_name, Fold};
use crate::stacks::kept::Tally;
use crate::stacks::ustack::stack_report;
use crate::stacks::Traced;

impl Fold for AllocStats {
    fn fold(vals: &[Self]) -> Self {
        AllocStats {
            allocs: vals.iter().map(|v| v.allocs).sum(),
            bytes: vals.iter().map(|v| v.bytes).sum(),
            frees: vals.iter().map(|v| v.frees).sum(),
            freed_bytes: vals.iter().map(|v| v.freed_bytes).sum(),
            comm: first_name(vals.iter().map(|v| v.comm)),
        }
    }
}

/// Where the current phase began (SIGUSR1): its time, and the per-stack
/// totals then, so churn figures count from it.
#[derive(Default)]
pub struct Phase {
    since_ns: u64,
    base: HashMap<StackKey, AllocStats>,
}

impl Phase {
    pub fn start(s: &mut Traced, t: Tables) -> Result<Phase> {
        Ok(Phase {
            since_ns: monotonic_ns(),
            base: s.read_folded(t.stacks, false)?.into_iter().collect(),
        })
    }
}

/// The clock of `bpf_ktime_get_ns`.
fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// What a report shows.
#[derive(Clone, Copy, Default)]
pub struct View<'a> {
    /// Frees not yet applied in the kernel (the shim's batches): process,
    /// address, time of the free. A block there allocated before it is
    /// not held.
    pub pending: &'a [(u32, u64, u64)],
    /// Allocations not yet applied in the kernel (the shim's batches, with
    /// the memo's stack): stack, address, time, size. Held.
    pub pending_allocs: &'a [(StackKey, u64, u64, u64)],
    /// Ordered by outstanding bytes (else by allocations).
    pub by_bytes: bool,
    /// Only allocations older than this (read from the live table).
    pub older: Option<std::time::Duration>,
    /// Made and freed per stack too, not only what is outstanding.
    pub churn: bool,
    /// Sampled: the figures are estimates.
    pub estimated: bool,
    /// Only these processes' stacks.
    pub only: Option<&'a std::collections::HashSet<u32>>,
    /// Rows of exited processes' stacks, resolved by what they show.
    pub exited_rows: &'a [StackReport],
    /// File names of the allocators probed that map their own arenas
    /// (not the C library's, whose mmaps of big blocks are the blocks):
    /// an anonymous mmap they make for a call that was not sampled is an
    /// arena the sampled blocks are carved from, not a block more.
    pub arenas: &'a [String],
}

/// What a report leaves out: (allocations, bytes) of the allocators' own
/// arenas.
pub type LeftOut = (u64, u64);

/// What a report takes from beyond the kernel's tables: the phase, the
/// totals of exited processes, and what went with execs.
pub type Adjust<'a> = (
    &'a Phase,
    &'a HashMap<StackKey, AllocStats>,
    &'a HashMap<StackKey, (u64, u64)>,
);

/// The stacks holding most, symbolized, best first (enough of them for
/// `--top` after merging).
pub fn outstanding(
    s: &mut Traced,
    t: Tables,
    args: View,
    (phase, exited, execd): Adjust,
    mode: u32,
) -> Result<(Vec<StackReport>, LeftOut)> {
    let shown = |tgid: u32| args.only.is_none_or(|o| o.contains(&tgid));
    let mut stats: HashMap<StackKey, AllocStats> = s
        .read_folded(t.stacks, false)?
        .into_iter()
        .filter(|(k, _)| shown(k.tgid))
        .collect();
    // Processes that exited: what they held then (never in the live table).
    for (k, v) in exited.iter().filter(|(k, _)| shown(k.tgid)) {
        stats.entry(*k).or_default().add(v);
    }
    // Blocks whose frees are pending, by stack (user blocks only: the
    // shim batches malloc's frees).
    let mut freed: HashMap<StackKey, (u64, u64)> = HashMap::new();
    let mut freed_at = std::collections::HashSet::new();
    for &(tgid, addr, ts) in args.pending {
        let key = AllocKey {
            addr,
            tgid,
            origin: origin::USER,
        };
        if let Some(a) = s.hash_get(t.allocs, &key).filter(|a| a.ts_ns <= ts) {
            if freed_at.insert((tgid, addr)) {
                let f = freed.entry(a.stack).or_default();
                f.0 += a.weight;
                f.1 += a.weight_bytes;
            }
        }
    }
    let mut held: HashMap<StackKey, (u64, u64)> = HashMap::new();
    if args.older.is_some() || phase.since_ns > 0 {
        let now = monotonic_ns();
        let min_age = args.older.map_or(0, |d| d.as_nanos() as u64);
        for (k, a) in s.hash_entries(t.allocs) {
            if a.ts_ns < phase.since_ns
                || now.saturating_sub(a.ts_ns) < min_age
                || !shown(a.stack.tgid)
                || freed_at.contains(&(a.stack.tgid, k.addr))
            {
                continue;
            }
            let h = held.entry(a.stack).or_default();
            h.0 += a.weight;
            h.1 += a.weight_bytes;
        }
    } else {
        for (k, v) in &stats {
            // Less what went with an exec of the image that made it.
            let (gn, gb) = execd.get(k).copied().unwrap_or_default();
            let (fn_, fb) = freed.get(k).copied().unwrap_or_default();
            let n = v.allocs.saturating_sub(v.frees + gn + fn_);
            let b = v.bytes.saturating_sub(v.freed_bytes + gb + fb);
            if n > 0 {
                held.insert(*k, (n, b));
            }
        }
    }
    // Allocations still in the shim's batches are held (in the phase and
    // past the age asked for, as the table's).
    if !args.pending_allocs.is_empty() {
        let now = monotonic_ns();
        let min_age = args.older.map_or(0, |d| d.as_nanos() as u64);
        for &(k, _, ts, size) in args.pending_allocs {
            if ts >= phase.since_ns && now.saturating_sub(ts) >= min_age && shown(k.tgid) {
                let h = held.entry(k).or_default();
                h.0 += 1;
                h.1 += size;
            }
        }
    }
    let mut top: Vec<(StackKey, (u64, u64))> = held.into_iter().filter(|(_, h)| h.0 > 0).collect();
    match args.by_bytes {
        true => top.sort_by(|a, b| b.1 .1.cmp(&a.1 .1).then(b.1 .0.cmp(&a.1 .0))),
        false => top.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(b.1 .1.cmp(&a.1 .1))),
    }
    // Every stack: --top is applied after merging (output::MergedStacks).
    let mut arenas = (0, 0);
    let in_arena = |f: &Shown| args.arenas.iter().any(|a| f.ends_with(&format!("[{a}]")));
    let mut reports = top
        .into_iter()
        .filter_map(|(k, (n, bytes))| {
            let v = stats.get(&k).copied().unwrap_or_default();
            let base = phase.base.get(&k).copied().unwrap_or_default();
            let comm = crate::session::records::comm(&v.comm);
            let ids = (k.ustack, k.ustack_check, k.kstack);
            let mut r = stack_report(s, k.tgid, comm, ids, mode, n, Some(bytes));
            without_shim(&mut r);
            // The mmap call's own frame first, then who called it.
            if r.user.iter().skip(1).any(in_arena) {
                arenas.0 += r.count;
                arenas.1 += bytes;
                return None;
            }
            if exited.contains_key(&k) && r.note.is_none() {
                r.note = Some(HELD_AT_EXIT.into());
            }
            r.alloc = Some(AllocFigures {
                allocs: v.allocs - base.allocs.min(v.allocs),
                bytes: v.bytes - base.bytes.min(v.bytes),
                frees: v.frees - base.frees.min(v.frees),
                freed_bytes: v.freed_bytes - base.freed_bytes.min(v.freed_bytes),
                churn: args.churn,
                estimated: args.estimated,
                by_bytes: args.by_bytes,
            });
            Some(r)
        })
        .collect::<Vec<_>>();
    // Exited processes' stacks already resolved to rows (memleak's
    // `Exited::resolve`): what they held at exit. Not in a phase or by age,
    // which read the live table only.
    if args.older.is_none() && phase.since_ns == 0 {
        for r in args.exited_rows.iter().filter(|r| r.count > 0) {
            let pids = || std::iter::once(&r.pid).chain(&r.pids);
            if args.only.is_some_and(|o| !pids().any(|p| o.contains(p))) {
                continue;
            }
            if r.user.iter().skip(1).any(in_arena) {
                arenas.0 += r.count;
                arenas.1 += r.bytes.unwrap_or(0);
                continue;
            }
            reports.push(r.clone());
        }
    }
    Ok((reports, arenas))
}

/// The shim's frames (its probe site, and its malloc under dwarf
/// unwinding) are not the program's code.
pub fn without_shim(r: &mut StackReport) {
    let n = r
        .user
        .iter()
        .take_while(|f| f.contains(super::SHIM_PREFIX))
        .count();
    r.user.drain(..n);
}

/// The note on what a process held when it exited.
pub const HELD_AT_EXIT: &str = "held when the process exited";

/// The words a report's title adds for what it left out.
pub fn left_out(arenas: LeftOut, names: &[String]) -> String {
    match arenas {
        (0, _) => String::new(),
        (n, b) => format!(
            "; {b} bytes in {n} mappings of {}'s own arenas left out (the sampled blocks are carved from them)",
            names.join(", ")
        ),
    }
}
