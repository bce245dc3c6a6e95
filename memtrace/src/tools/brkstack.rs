//! `memtrace brkstack`: brk calls counted in the kernel by (process, user
//! stack), with the bytes the heap grew by.

use std::collections::HashMap;
use std::time::Duration;

use memtrace_common::{
    stack_mode,
    stacks::{BrkConfig, StackKey, StackVal},
};

use crate::attach::Probe;
use crate::error::Result;
use crate::output::{clock, Printer, StackReport};
use crate::run::{Prep, Tool};
use crate::session::Session;
use crate::tools::{first_comm, sampled_reports, sampled_title, stack_report, IntervalArgs};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::cli::Common,
    #[command(flatten)]
    pub interval: IntervalArgs,
    /// Show only the N most frequent stacks.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// Add kernel stacks.
    #[arg(long)]
    pub kernel_stacks: bool,
    /// Print stacks folded (`comm;outer;...;inner count`), for flame graphs.
    #[arg(long)]
    pub folded: bool,
    #[command(flatten)]
    pub stacks: crate::cli::StackArgs,
}

pub fn probes() -> Vec<Probe> {
    vec![Probe::new("brk calls").tracepoint("brk_enter", "syscalls", "sys_enter_brk")]
}

pub struct Brkstack {
    args: Args,
    calls: u64,
    intervals: u64,
}

impl Brkstack {
    pub fn new(a: &Args) -> Result<Self> {
        Ok(Brkstack {
            args: a.clone(),
            calls: 0,
            intervals: 0,
        })
    }

    fn report(&mut self, s: &mut Session, out: &mut dyn Printer, clear: bool) -> Result<()> {
        let agg: HashMap<StackKey, (u64, u64, String)> = s
            .read_percpu::<StackKey, StackVal>("BRK_STACKS", clear)?
            .into_iter()
            .map(|(k, vals)| {
                let count = vals.iter().map(|v| v.count).sum();
                let bytes = vals.iter().map(|v| v.bytes).sum();
                (k, (count, bytes, first_comm(vals.iter().map(|v| &v.comm))))
            })
            .collect();
        let calls: u64 = agg.values().map(|v| v.0).sum();
        self.calls = if clear { self.calls + calls } else { calls };
        let mut v: Vec<_> = agg.into_iter().collect();
        v.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(b.1 .1.cmp(&a.1 .1)));
        v.truncate(self.args.top);
        let mode = self.stack_mode();
        let reports: Vec<StackReport> = match sampled_reports(s, clear, mode, self.args.top, true) {
            Some(r) => r,
            None => v
                .into_iter()
                .map(|(k, (c, b, n))| {
                    stack_report(s, k.tgid, n, (k.ustack, k.kstack), mode, c, Some(b))
                })
                .collect(),
        };
        let title = match (self.args.interval.interval.is_some(), sampled_title(s)) {
            (true, t) if t.is_empty() => format!("{} brk calls by stack", clock()),
            (true, t) => format!("{} brk calls by stack ({t})", clock()),
            (false, t) => t,
        };
        out.stacks("brk_stack", &title, &reports);
        Ok(())
    }
}

impl Tool for Brkstack {
    fn name(&self) -> &'static str {
        "brkstack"
    }
    fn what(&self) -> String {
        "brk calls by user stack".into()
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
    fn folded(&self) -> bool {
        self.args.folded
    }
    fn user_stacks(&self) -> Option<(&crate::cli::StackArgs, bool)> {
        // brk is called at most thousands of times a second: copy every stack.
        Some((&self.args.stacks, true))
    }
    fn interval(&self) -> Option<Duration> {
        self.args.interval.interval
    }

    fn prepare(&mut self, k: &mut Prep) -> Result<()> {
        k.task_offsets()?;
        let f = k.format("syscalls", "sys_enter_brk")?;
        k.loader.global(
            "BRK_CFG",
            &BrkConfig {
                tp_brk: f.offset("brk")?,
                _pad: 0,
            },
        );
        k.loader.max_entries("BRK_STACKS", 8192);
        Ok(())
    }

    fn on_interval(&mut self, s: &mut Session, out: &mut dyn Printer) -> Result<bool> {
        self.report(s, out, true)?;
        self.intervals += 1;
        Ok(self.args.interval.count.is_none_or(|c| self.intervals < c))
    }

    fn finish(&mut self, s: &mut Session, out: &mut dyn Printer) -> Result<()> {
        let clear = self.args.interval.interval.is_some();
        self.report(s, out, clear)
    }

    fn events(&self) -> u64 {
        self.calls
    }
}
