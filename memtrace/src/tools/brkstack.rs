//! `memtrace brkstack`: brk calls counted in the kernel by (process, user
//! stack), with the bytes the heap grew by.

use memtrace_common::{
    names::BRK_STACKS,
    stack_mode,
    stacks::{StackKey, StackVal},
};

use crate::error::Result;
use crate::output::{clock, Merger, Printer};
use crate::run::args::IntervalArgs;
use crate::run::tool::{About, Prep, Tool};
use crate::session::attach::Probe;
use crate::stacks::args::StackArgs;
use crate::stacks::kept::{resolved, Kept};
use crate::stacks::ustack::{sampled_reports, sampled_title, stack_report};
use crate::stacks::Traced;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::run::args::Common,
    #[command(flatten)]
    pub interval: IntervalArgs,
    /// Show only the N most frequent stacks (text: 20 unless given; JSON,
    /// folded output and records carry every stack unless given). What the
    /// others add up to is said.
    #[arg(long)]
    pub top: Option<usize>,
    /// Add kernel stacks.
    #[arg(long)]
    pub kernel_stacks: bool,
    /// Print stacks folded (`comm;outer;...;inner count`), for flame graphs.
    #[arg(long)]
    pub folded: bool,
    #[command(flatten)]
    pub stacks: StackArgs,
    /// Keys of the kernel's count map. Tests shrink it to show that long
    /// runs never fill it.
    #[arg(long, hide = true, default_value_t = 8192, value_parser = clap::value_parser!(u32).range(1..))]
    pub keys: u32,
    /// Counts by stack kept in runs without -i before those of exited
    /// processes are folded. Tests shrink it.
    #[arg(long, hide = true, default_value_t = crate::stacks::kept::MAX_KEPT)]
    pub max_kept: usize,
}

pub fn probes() -> Vec<Probe> {
    vec![crate::probes::counters::brk_probe()]
}

pub struct Brkstack {
    args: Args,
    calls: u64,
    /// `calls` and what a SIGUSR1 report (not clearing) showed since.
    seen: u64,
    /// Calls moved out of the kernel since the start: the progress line's
    /// count until a report has counted them all.
    drained: u64,
    /// What `drain` moved out of the kernel's map since the last report.
    kept: Kept<StackKey, StackVal>,
}

impl Brkstack {
    pub fn new(a: &Args) -> Result<Self> {
        Ok(Brkstack {
            args: a.clone(),
            calls: 0,
            seen: 0,
            drained: 0,
            kept: Kept::new(a.max_kept).per_pid(a.common.per_pid),
        })
    }
}

pub const ABOUT: About = About {
    name: "brkstack",
    help: "Heap growth (brk) counted by user stack",
    traces: "brk calls by user stack",
    interval: None,
};

impl Tool for Brkstack {
    fn about(&self) -> &'static About {
        &ABOUT
    }
    fn probes(&self) -> Vec<Probe> {
        probes()
    }
    fn stack_mode(&self) -> u32 {
        stack_mode::USER
            | if self.args.kernel_stacks {
                stack_mode::KERNEL
            } else {
                0
            }
    }
    fn top(&self) -> Option<usize> {
        self.args.top
    }
    fn folded(&self) -> bool {
        self.args.folded
    }
    fn user_stacks(&self) -> Option<(&StackArgs, bool)> {
        // brk is called at most thousands of times a second: copy every stack.
        Some((&self.args.stacks, true))
    }
    fn intervals(&self) -> Option<&IntervalArgs> {
        Some(&self.args.interval)
    }

    fn prepare(&mut self, k: &mut Prep) -> Result<()> {
        crate::probes::counters::prepare_brk(k)?;
        k.image_keys(self.args.common.per_pid);
        k.loader.max_entries(BRK_STACKS, self.args.keys);
        Ok(())
    }

    fn report(&mut self, s: &mut Traced, out: &mut dyn Printer, clear: bool) -> Result<()> {
        let mut v = s.read_counts(BRK_STACKS, clear)?;
        if !self.kept.counts.is_empty() {
            let mut all = Kept::new(self.kept.max);
            all.counts = if clear {
                std::mem::take(&mut self.kept.counts)
            } else {
                self.kept.counts.clone()
            };
            for (k, val) in v {
                all.add(k, &val);
            }
            v = all.counts.into_iter().collect();
        }
        let resolved = self.kept.resolved_reports(clear);
        let calls: u64 = v.iter().map(|(_, val)| val.count).sum::<u64>()
            + resolved.iter().map(|r| r.count).sum::<u64>();
        if clear {
            self.calls += calls;
            self.seen = self.calls;
        } else {
            self.seen = self.calls + calls;
        }
        // Every stack: --top is applied after merging (output::MergedStacks).
        // Merged as they are made: a churn leaves tens of thousands.
        let mode = self.stack_mode();
        let mut reports = Merger::new(self.kept.per_pid);
        match s.dwarf.is_some() {
            true => {
                let r = sampled_reports(s, clear, usize::MAX, true)
                    .into_iter()
                    .flatten();
                r.for_each(|r| reports.push(r));
            }
            false => {
                for (k, val) in v {
                    let comm = crate::session::records::comm(&val.comm);
                    let ids = (k.ustack, k.kstack);
                    let full = (k.ustack, k.ustack_check, k.kstack);
                    let mut r =
                        stack_report(s, k.tgid, comm, full, mode, val.count, Some(val.bytes));
                    if k.forked != 0 {
                        s.members.name(&mut r, ids);
                    }
                    reports.push(r);
                }
            }
        }
        resolved.into_iter().for_each(|r| reports.push(r));
        let reports = reports.finish();
        let title = match (self.args.interval.every().is_some(), sampled_title(s)) {
            (true, t) if t.is_empty() => format!("{} brk calls by stack", clock()),
            (true, t) => format!("{} brk calls by stack ({t})", clock()),
            (false, t) => t,
        };
        out.stacks("brk_stack", &title, &reports);
        if clear {
            s.members.clear();
        }
        Ok(())
    }

    fn drain(&mut self, s: &mut Traced) -> Result<usize> {
        let v = s.read_counts(BRK_STACKS, true)?;
        let n = v.len();
        for (k, val) in v {
            self.drained += val.count;
            self.kept.add(k, &val);
        }
        let mode = self.stack_mode();
        self.kept
            .resolve_exited(crate::process::proc::alive, |k, val| {
                let comm = crate::session::records::comm(&val.comm);
                let ids = (k.ustack, k.kstack);
                let full = (k.ustack, k.ustack_check, k.kstack);
                let mut r = stack_report(s, k.tgid, comm, full, mode, val.count, Some(val.bytes));
                if k.forked != 0 {
                    s.members.name(&mut r, ids);
                }
                resolved(r)
            });
        self.kept.forget_members(s, crate::process::proc::alive);
        self.kept.settle_stacks(&mut s.stacks);
        self.kept.forget_maps(&s.sym.maps);
        Ok(n)
    }

    fn events(&self) -> u64 {
        self.seen.max(self.drained)
    }

    fn on_start(&mut self, s: &mut Traced) -> Result<()> {
        self.kept.share_with_samples(s);
        Ok(())
    }

    fn summary_extra(&self) -> Vec<(&'static str, crate::output::Value)> {
        self.kept.summary()
    }
}
