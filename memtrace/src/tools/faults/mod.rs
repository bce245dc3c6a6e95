//! `memtrace faults`: page faults counted per CPU in the kernel, by process
//! (user and kernel mode apart), by stack, or by the mapping they hit.

use std::collections::HashMap;

use memtrace_common::{
    faults::{FaultConfig, FaultKey, FORKED},
    names::{EXEC_NAMES, FAULTS, FAULTS_PERF, FAULT_SLOTS, FAULT_SLOT_FREE},
    stack_mode,
    stacks::USTACK_SPILLED,
};

use crate::error::{Error, Result};
use crate::output::{clock, Col, Merger, Printer, Row};
use crate::probes::follow::{exec_names, exec_probe};
use crate::run::args::IntervalArgs;
use crate::run::tool::{About, Prep, Tool};
use crate::session::attach::Probe;
use crate::session::records::comm;
use crate::stacks::ustack::{sampled_reports, sampled_title, stack_report};
use crate::stacks::Traced;

mod kept;
mod mapping;
mod slots;
mod spill;
use kept::Kept;
use slots::Slots;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::run::args::Common,
    #[command(flatten)]
    pub interval: IntervalArgs,
    /// Show only the N largest entries (text: 20 unless given; JSON, folded
    /// output and records carry every entry unless given). What the others
    /// add up to is said.
    #[arg(long)]
    pub top: Option<usize>,
    /// Count by user stack.
    #[arg(long)]
    pub stacks: bool,
    /// Count by kernel stack too.
    #[arg(long)]
    pub kernel_stacks: bool,
    /// Print stacks folded, for flame graphs.
    #[arg(long)]
    pub folded: bool,
    /// Which mappings of the traced process take the faults (needs -p or -c).
    #[arg(long)]
    pub by_mapping: bool,
    #[command(flatten)]
    pub stack_args: crate::stacks::args::StackArgs,
    /// Per-CPU count-by-process slots (a power of two; 0: hash map only).
    /// Tests shrink it to force processes onto the hash map.
    #[arg(long, hide = true, default_value_t = 1024)]
    pub slots: u32,
    /// Counts by stack kept in runs without -i before those of exited
    /// processes are folded. Tests shrink it.
    #[arg(long, hide = true, default_value_t = crate::stacks::kept::MAX_KEPT)]
    pub max_kept: usize,
    /// Keys of the kernel's count map (default 16384, 65536 by stack,
    /// 262144 by mapping; allocated as used). Faults it has no room for
    /// are still counted, by process ("[count map full...]" rows).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub keys: Option<u32>,
}

/// Per-CPU slots for faults counted by process while the count map is
/// full (by stack): a process whose slot another holds goes to the one
/// faceless row.
const SPILL_SLOTS: u32 = 4096;

pub fn probes() -> Vec<Probe> {
    let mut p = crate::probes::counters::fault_probes();
    p.push(exec_probe());
    p
}

pub struct Faults {
    args: Args,
    /// Whether the count-by-process slots are in use: for every fault
    /// (`slotted`), or by stack for those the full count map could not
    /// take (`spill_slots`).
    slotted: bool,
    spill_slots: bool,
    slots: Slots,
    total: u64,
    /// Everything counted, for the final report in interval mode.
    seen: u64,
    /// Counts moved out of the kernel's map while no interval reports clear
    /// it (`drain`), for the final report.
    kept: Kept,
    spill: spill::Spill,
}

impl Faults {
    pub fn new(a: &Args) -> Result<Self> {
        if a.by_mapping && a.common.pid.is_none() && a.common.command.is_none() {
            return Err(Error::Usage("--by-mapping needs -p PID or -c CMD".into()));
        }
        if a.folded && !a.stacks && !a.kernel_stacks {
            return Err(Error::Usage(
                "--folded needs --stacks or --kernel-stacks".into(),
            ));
        }
        if a.slots != 0 && !a.slots.is_power_of_two() {
            return Err(Error::Usage("--slots must be a power of two".into()));
        }
        Ok(Faults {
            args: a.clone(),
            slotted: false,
            spill_slots: false,
            slots: Slots::default(),
            total: 0,
            seen: 0,
            kept: Kept::new(a.max_kept).per_pid(a.common.per_pid),
            spill: spill::Spill::default(),
        })
    }

    fn mode(&self) -> u32 {
        let mut m = 0;
        if self.args.stacks {
            m |= stack_mode::USER;
        }
        if self.args.kernel_stacks {
            m |= stack_mode::KERNEL;
        }
        m
    }

    /// Reads (and with `clear`, empties) the per-CPU counters.
    fn collect(&mut self, s: &mut Traced, clear: bool) -> Result<Vec<(FaultKey, u64, String)>> {
        // One of the two maps is used, depending on how the probe attached.
        let raw = if clear {
            let gen = s.next_generation()?;
            let mut r = s.take_counts(FAULTS, gen)?;
            r.extend(s.take_counts(FAULTS_PERF, gen)?);
            r
        } else {
            let mut r = s.read_counts(FAULTS, false)?;
            r.extend(s.read_counts(FAULTS_PERF, false)?);
            r
        };
        let mut out: Vec<(FaultKey, u64, String)> = raw
            .into_iter()
            .map(|(k, v)| (k, v.count, comm(&v.comm)))
            .collect();
        // The spill slots are read only once anything spilled: 4,096
        // per-CPU slots at every drain took a tenth of memtrace's CPU.
        let spilled = || {
            s.degraded()
                .iter()
                .any(|(r, n)| *r == "count_spilled" && *n > 0)
        };
        if self.slotted || (self.spill_slots && spilled()) {
            self.slots.read(s)?;
            let ustack = if self.spill_slots { USTACK_SPILLED } else { -1 };
            for (tgid, (counts, comm)) in &self.slots.pending {
                for (mode, c) in counts.iter().enumerate().filter(|(_, c)| **c > 0) {
                    let key = FaultKey {
                        tgid: *tgid,
                        kernel_mode: mode as u8,
                        ustack,
                        kstack: -1,
                        ..Default::default()
                    };
                    out.push((key, *c, comm.clone()));
                }
            }
            if clear {
                self.slots.pending.clear();
            }
        }
        out.extend(self.spill.read(s, clear)?);
        let renamed = exec_names(s);
        for (k, _, name) in out.iter_mut() {
            if let Some(n) = renamed.get(&k.tgid) {
                name.clone_from(n);
            }
        }
        let n: u64 = out.iter().map(|(_, c, _)| c).sum();
        if clear {
            self.total += n;
            self.seen = self.total;
        } else {
            self.seen = self.total + n;
        }
        if self.kept.counts.is_empty() {
            return Ok(out);
        }
        // What `drain` moved out joins what the kernel holds now.
        let mut all = if clear {
            std::mem::take(&mut self.kept.counts)
        } else {
            self.kept.counts.clone()
        };
        for (k, c, name) in out {
            let e = all.entry(k).or_insert((0, name));
            e.0 += c;
        }
        // Drained before its exec, a process kept its earlier name.
        for (k, (_, name)) in all.iter_mut() {
            if let Some(n) = renamed.get(&k.tgid) {
                name.clone_from(n);
            }
        }
        Ok(all.into_iter().map(|(k, (c, n))| (k, c, n)).collect())
    }

    fn report_counts(&mut self, s: &mut Traced, out: &mut dyn Printer, clear: bool) -> Result<()> {
        let data = self.collect(s, clear)?;
        let title = if self.args.interval.every().is_some() {
            format!("{} page faults", clock())
        } else {
            String::new()
        };
        if self.args.by_mapping {
            return self.by_mapping(s, out, &data, &title);
        }
        if self.args.stacks || self.args.kernel_stacks {
            // By process, user stack (id and check), kernel stack, and
            // forked: the owner's own counts and its forks' apart (merged
            // by what they show, with the processes of each).
            type Row = (u32, i32, u32, i32, bool);
            let mut agg: HashMap<Row, (u64, String)> = HashMap::new();
            for (k, c, n) in &data {
                let forked = k.kernel_mode & FORKED != 0;
                let e = agg
                    .entry((k.tgid, k.ustack, k.ustack_check as u32, k.kstack, forked))
                    .or_insert((0, n.clone()));
                e.0 += c;
            }
            // Every stack: --top is applied after merging (output::MergedStacks).
            let mode = self.mode();
            // Merged as they are made: a churn leaves tens of thousands.
            let mut reports = Merger::new(self.kept.per_pid);
            match s.dwarf.is_some() {
                true => {
                    let r = sampled_reports(s, clear, usize::MAX, false)
                        .into_iter()
                        .flatten();
                    r.for_each(|r| reports.push(r));
                }
                false => {
                    for ((pid, u, check, k, forked), (c, n)) in agg {
                        let faceless = pid == 0 && n == spill::NAME;
                        let mut r = stack_report(s, pid, n, (u, check, k), mode, c, None);
                        if forked {
                            s.members.name(&mut r, (u, k));
                        }
                        if faceless {
                            r.note = Some(spill::NOTE.into());
                        } else if u == USTACK_SPILLED {
                            r.note = Some(spill::NOTE_BY_PROCESS.into());
                        }
                        reports.push(r);
                    }
                }
            }
            for r in self.kept.resolved_reports(clear) {
                reports.push(r);
            }
            let reports = reports.finish();
            let title = match sampled_title(s) {
                t if t.is_empty() => title,
                t if title.is_empty() => t,
                t => format!("{title} ({t})"),
            };
            out.stacks("fault_stack", &title, &reports);
            if clear {
                s.members.clear();
            }
            return Ok(());
        }
        let mut agg: HashMap<u32, (u64, u64, String)> = HashMap::new();
        for (k, c, n) in &data {
            let e = agg.entry(k.tgid).or_insert((0, 0, n.clone()));
            if k.kernel_mode == 0 {
                e.0 += c;
            } else {
                e.1 += c;
            }
        }
        let mut v: Vec<_> = agg.into_iter().collect();
        v.sort_by(|a, b| {
            (b.1 .0 + b.1 .1)
                .cmp(&(a.1 .0 + a.1 .1))
                .then(a.0.cmp(&b.0))
        });
        let shown = crate::run::tool::shown(self.args.top, &self.args.common, self.args.folded);
        let rest = crate::output::cut(&mut v, shown, "processes", |e| e.1 .0 + e.1 .1);
        let cols = [
            Col::num("pid", "PID", 7),
            Col::text("comm", "COMM", 16),
            Col::num("user", "USER", 10),
            Col::num("kernel", "KERNEL", 10),
            Col::num("total", "TOTAL", 10),
        ];
        let rows: Vec<Row> = v
            .into_iter()
            .map(|(pid, (u, k, n))| {
                Row(vec![
                    pid.into(),
                    n.into(),
                    u.into(),
                    k.into(),
                    (u + k).into(),
                ])
            })
            .collect();
        out.table("faults", &title, &cols, &rows);
        if let Some(r) = rest {
            out.rest("faults", &r);
        }
        Ok(())
    }
}

pub const ABOUT: About = About {
    name: "faults",
    help: "Page faults counted in the kernel, by process, stack or mapping",
    traces: "page faults",
    interval: None,
};

impl Tool for Faults {
    fn about(&self) -> &'static About {
        &ABOUT
    }
    fn probes(&self) -> Vec<Probe> {
        probes()
    }
    fn stack_mode(&self) -> u32 {
        self.mode()
    }
    fn top(&self) -> Option<usize> {
        self.args.top
    }
    fn folded(&self) -> bool {
        self.args.folded
    }
    fn user_stacks(&self) -> Option<(&crate::stacks::args::StackArgs, bool)> {
        // Faults come by the hundred thousand a second: not rare.
        self.args.stacks.then_some((&self.args.stack_args, false))
    }
    fn intervals(&self) -> Option<&IntervalArgs> {
        Some(&self.args.interval)
    }

    fn prepare(&mut self, k: &mut Prep) -> Result<()> {
        let mut cfg = FaultConfig {
            by_page: self.args.by_mapping as u32,
            ..Default::default()
        };
        // By stack, each new process brings keys of its own: room for the
        // bursts between two drains (allocated only as keys appear).
        let size = self.args.keys.unwrap_or(if self.args.by_mapping {
            262_144
        } else if self.mode() != 0 {
            65_536
        } else {
            16_384
        });
        self.slotted = self.mode() == 0 && !self.args.by_mapping && self.args.slots != 0;
        // By stack, faults the full map cannot take stay by process.
        self.spill_slots = self.mode() != 0 && !self.args.by_mapping;
        if self.slotted {
            cfg.slot_mask = self.args.slots - 1;
            k.loader.max_entries(FAULT_SLOTS, self.args.slots);
            k.loader.max_entries(FAULT_SLOT_FREE, self.args.slots);
        } else if self.spill_slots {
            cfg.spill_mask = SPILL_SLOTS - 1;
            k.loader.max_entries(FAULT_SLOTS, SPILL_SLOTS);
            k.loader.max_entries(FAULT_SLOT_FREE, SPILL_SLOTS);
        }
        k.loader.max_entries(EXEC_NAMES, 4096);
        if self.mode() != 0 && !self.args.by_mapping {
            k.image_keys(self.args.common.per_pid);
        }
        crate::probes::counters::prepare_faults(k, cfg, size)?;
        Ok(())
    }

    fn report(&mut self, s: &mut Traced, out: &mut dyn Printer, clear: bool) -> Result<()> {
        self.report_counts(s, out, clear)
    }

    fn drain(&mut self, s: &mut Traced) -> Result<usize> {
        // `collect` adds what is kept to what it reads: kept aside meanwhile.
        let kept = std::mem::take(&mut self.kept.counts);
        let moved = self.collect(s, true)?;
        self.kept.counts = kept;
        let n = moved.len();
        for (k, c, name) in moved {
            self.kept.add(k, &(c, name));
        }
        let mode = self.mode();
        self.kept
            .resolve_exited(crate::process::proc::alive, |k, (c, name)| {
                let ids = (k.ustack, k.ustack_check as u32, k.kstack);
                let mut r = stack_report(s, k.tgid, name.clone(), ids, mode, *c, None);
                if k.kernel_mode & FORKED != 0 {
                    s.members.name(&mut r, (k.ustack, k.kstack));
                }
                crate::stacks::kept::resolved(r)
            });
        self.kept.forget_members(s, crate::process::proc::alive);
        self.kept.settle_stacks(&mut s.stacks);
        // --by-mapping places a gone process's pages in its maps at reports.
        if !self.args.by_mapping {
            self.kept.forget_maps(&s.sym.maps);
        }
        Ok(n)
    }

    fn events(&self) -> u64 {
        self.seen
    }

    fn on_start(&mut self, s: &mut Traced) -> Result<()> {
        self.kept.share_with_samples(s);
        if self.args.by_mapping {
            // A page's mapping is looked up at the report.
            s.sym.maps.lock().unwrap().keep_exited = true;
        }
        Ok(())
    }

    fn summary_extra(&self) -> Vec<(&'static str, crate::output::Value)> {
        self.kept.summary()
    }
}
