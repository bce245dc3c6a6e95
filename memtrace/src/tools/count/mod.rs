//! `memtrace count`: events of any tracepoint counted in the kernel, by
//! process, thread, comm, cgroup, stack or the record's own fields, with a
//! field summed on request: BCC's funccount and stackcount and bpftrace's
//! `@[...] = count()` / `sum()` one-liners, with `-p` that filters.

mod keys;

use std::time::Duration;

use memtrace_common::{
    generic::{by, CountKey, CountVal},
    names::{COUNTS, COUNT_AT, COUNT_TP, COUNT_TPS},
    stack_mode,
};

use crate::error::{Error, Result};
use crate::output::{clock, Col, Printer, Row, StackReport, Value};
use crate::probes::tpspec::{expand, parse_filter, tracepoint_probes, FilterSpec, Selected, Spec};
use crate::run::args::{parse_duration, IntervalArgs};
use crate::run::tool::{About, Drained, Prep, Tool};
use crate::session::attach::Probe;
use crate::session::records::comm;
use crate::session::{first_name, Fold};
use crate::stacks::args::StackArgs;
use crate::stacks::ustack::{sampled_reports, stack_report};
use crate::stacks::Traced;
use keys::KeyCol;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::run::args::Common,
    /// Tracepoints as CATEGORY:NAME, wildcards allowed ('vmscan:*',
    /// 'kmem:mm_page_*'), then optionally INTERVAL [COUNT].
    #[arg(required = true, value_name = "PATTERN")]
    pub patterns: Vec<String>,
    /// Count by pid, tid, comm, cgroup, container, pod, ustack, kstack or a
    /// numeric field of the record (repeatable or comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub by: Vec<String>,
    /// Also sum this numeric field of the record.
    #[arg(long, value_name = "FIELD")]
    pub sum: Option<String>,
    /// Count only events where 'FIELD OP VALUE' holds (OP: == != < <= > >= &),
    /// tested in the kernel; repeatable, all must hold.
    #[arg(long, value_parser = parse_filter)]
    pub filter: Vec<FilterSpec>,
    /// Report every interval (also as a trailing INTERVAL argument).
    #[arg(short = 'i', long = "interval", value_parser = parse_duration)]
    pub interval: Option<Duration>,
    /// Stop after this many interval reports.
    #[arg(long = "count")]
    pub count: Option<u64>,
    /// Show only the N largest counts of each tracepoint.
    #[arg(long)]
    pub top: Option<usize>,
    /// Print stacks folded (`comm;outer;...;inner count`), for flame graphs.
    #[arg(long)]
    pub folded: bool,
    #[command(flatten)]
    pub stacks: StackArgs,
}

pub struct Count {
    args: Args,
    intervals: IntervalArgs,
    spec: Spec,
    cols: Vec<KeyCol>,
    mode: u32,
    selected: Vec<Selected>,
    total: u64,
    /// `total` and what a SIGUSR1 report (not clearing) showed since.
    seen: u64,
    /// Counts moved out of the kernel's map while no interval reports clear
    /// it (`drain`), for the final report.
    kept: Drained<CountKey, CountVal>,
}

/// Trailing plain numbers are `INTERVAL [COUNT]`: a tracepoint always has a colon.
fn split_interval(a: &Args) -> Result<(Vec<String>, IntervalArgs)> {
    let mut pats = a.patterns.clone();
    let mut nums = Vec::new();
    while nums.len() < 2 && pats.last().is_some_and(|p| !p.contains(':')) && pats.len() > 1 {
        nums.insert(0, pats.pop().unwrap_or_default());
    }
    let mut iv = IntervalArgs {
        interval: a.interval,
        count: a.count,
        ..Default::default()
    };
    if let Some(i) = nums.first() {
        iv.interval_pos = Some(parse_duration(i).map_err(Error::Usage)?);
    }
    if let Some(c) = nums.get(1) {
        iv.count_pos = Some(
            c.parse()
                .map_err(|_| Error::Usage(format!("'{c}' is not a count of reports")))?,
        );
    }
    if (iv.interval.is_some() && iv.interval_pos.is_some())
        || (iv.count.is_some() && iv.count_pos.is_some())
    {
        return Err(Error::Usage("the interval or count is given twice".into()));
    }
    Ok((pats, iv))
}

impl Count {
    pub fn new(a: &Args) -> Result<Self> {
        let (patterns, intervals) = split_interval(a)?;
        let mut spec = Spec {
            sum: a.sum.clone(),
            filters: a.filter.clone(),
            ..Default::default()
        };
        let (mut cols, mut mode) = (Vec::new(), 0);
        for b in &a.by {
            let col = match b.as_str() {
                "pid" => (spec.by |= by::PID, KeyCol::Pid).1,
                "tid" => (spec.by |= by::TID, KeyCol::Tid).1,
                "comm" => (spec.by |= by::COMM, KeyCol::Comm).1,
                "cgroup" => (spec.by |= by::CGROUP, KeyCol::Cgroup).1,
                "container" => (spec.by |= by::CGROUP, KeyCol::Container).1,
                "pod" => (spec.by |= by::CGROUP, KeyCol::Pod).1,
                "ustack" => {
                    mode |= stack_mode::USER;
                    continue;
                }
                "kstack" => {
                    mode |= stack_mode::KERNEL;
                    continue;
                }
                f => {
                    spec.keys.push(f.to_string());
                    // Column names live as long as the run; leaked once.
                    KeyCol::Field(
                        spec.keys.len() - 1,
                        Box::leak(f.to_string().into_boxed_str()),
                    )
                }
            };
            if !cols.contains(&col) {
                cols.push(col);
            }
        }
        if mode != 0 {
            // Stacks are reported per process (user frames need its maps).
            spec.by |= by::PID;
            if cols
                .iter()
                .any(|c| !matches!(c, KeyCol::Pid | KeyCol::Comm))
            {
                return Err(Error::Usage(
                    "--by ustack/kstack combines with pid and comm only".into(),
                ));
            }
        } else if a.folded {
            return Err(Error::Usage("--folded needs --by ustack or kstack".into()));
        }
        let selected = expand(&patterns)?;
        // Every field must resolve on every tracepoint: checked before loading.
        for (i, sel) in selected.iter().enumerate() {
            spec.config(i, sel, 0)?;
        }
        Ok(Count {
            args: a.clone(),
            intervals,
            spec,
            cols,
            mode,
            selected,
            total: 0,
            seen: 0,
            kept: Default::default(),
        })
    }

    fn header(&self) -> Vec<Col> {
        let mut h = vec![Col::text("tracepoint", "TRACEPOINT", 32)];
        for c in &self.cols {
            h.push(match *c {
                KeyCol::Pid => Col::num("pid", "PID", 7),
                KeyCol::Tid => Col::num("tid", "TID", 7),
                KeyCol::Comm => Col::text("comm", "COMM", 16),
                KeyCol::Cgroup => Col::text("cgroup", "CGROUP", 24),
                KeyCol::Container => Col::text("container", "CONTAINER", 12),
                KeyCol::Pod => Col::text("pod", "POD", 36),
                KeyCol::Field(_, name) => Col::num(name, name, 12),
            });
        }
        h.push(Col::num("count", "COUNT", 10));
        if let Some(s) = &self.args.sum {
            let name: &'static str = Box::leak(format!("sum_{s}").into_boxed_str());
            let header: &'static str = Box::leak(format!("SUM({s})").into_boxed_str());
            h.push(Col::num(name, header, 14));
        }
        h
    }

    fn row(&self, index: u32, cells: Vec<Value>, count: u64, sum: u64) -> Row {
        let label = self.selected.get(index as usize).map(Selected::label);
        let mut r: Vec<Value> = vec![label.unwrap_or_default().into()];
        r.extend(cells);
        r.push(count.into());
        if self.args.sum.is_some() {
            r.push(sum.into());
        }
        Row(r)
    }

    fn stack_reports(
        &self,
        s: &mut Traced,
        clear: bool,
        v: &[(CountKey, CountVal)],
        index: u32,
    ) -> Vec<StackReport> {
        // Every stack: --top is applied after merging (output::MergedStacks).
        if let Some(r) = sampled_reports(s, clear, usize::MAX, self.args.sum.is_some()) {
            return r.collect();
        }
        v.iter()
            .filter(|(k, _)| k.index == index)
            .map(|(k, val)| {
                let name = comm(&first_name([k.comm, val.comm].into_iter()));
                let sum = self.args.sum.is_some().then_some(val.sum);
                stack_report(
                    s,
                    k.tgid,
                    name,
                    (k.ustack, k.ustack_check, k.kstack),
                    self.mode,
                    val.count,
                    sum,
                )
            })
            .collect()
    }
}

/// Adds `b` into `a` (counts, sums; the first name seen stays).
impl Fold for CountVal {
    fn fold(vals: &[Self]) -> Self {
        CountVal {
            count: vals.iter().map(|v| v.count).sum(),
            sum: vals.iter().fold(0u64, |a, v| a.wrapping_add(v.sum)),
            comm: first_name(vals.iter().map(|v| v.comm)),
        }
    }
}

pub const ABOUT: About = About {
    name: "count",
    help: "Events of any tracepoint counted in the kernel, by process, stack or field",
    traces: "tracepoint events",
    interval: None,
};

impl Tool for Count {
    fn about(&self) -> &'static About {
        &ABOUT
    }
    fn what(&self) -> String {
        crate::probes::tpspec::what(&self.selected)
    }
    fn probes(&self) -> Vec<Probe> {
        tracepoint_probes(&self.selected, COUNT_TP, &COUNT_AT)
    }
    fn stack_mode(&self) -> u32 {
        self.mode
    }
    fn user_stacks(&self) -> Option<(&StackArgs, bool)> {
        // Tracepoints can fire millions of times a second: no stack copy per
        // event unless asked for (--stack-mode dwarf, --sample).
        (self.mode & stack_mode::USER != 0).then_some((&self.args.stacks, false))
    }
    fn top(&self) -> Option<usize> {
        // Tables are cut here; stacks after merging.
        self.args.top.filter(|_| self.mode != 0)
    }
    fn folded(&self) -> bool {
        self.args.folded
    }
    fn intervals(&self) -> Option<&IntervalArgs> {
        Some(&self.intervals)
    }

    fn prepare(&mut self, k: &mut Prep) -> Result<()> {
        if self.spec.by & by::CGROUP != 0 {
            // Groups by the memory controller's hierarchy, where BTF says
            // how to read it; else the unified hierarchy's id.
            if let Err(e) = k.task_offsets() {
                say!("memtrace: count: groups of the unified hierarchy, not the memory controller's: {e}");
            }
        }
        k.loader.max_entries(COUNT_TPS, self.selected.len() as u32);
        k.loader.max_entries(COUNTS, 16384);
        Ok(())
    }

    fn on_start(&mut self, s: &mut Traced) -> Result<()> {
        for (i, sel) in self.selected.iter().enumerate() {
            let cfg = self.spec.config(i, sel, 0)?;
            s.set_array(COUNT_TPS, i as u32, cfg)?;
        }
        Ok(())
    }

    fn report(&mut self, s: &mut Traced, out: &mut dyn Printer, clear: bool) -> Result<()> {
        let read = s.read_counts(COUNTS, clear)?;
        let n: u64 = read.iter().map(|(_, val)| val.count).sum();
        let drained: u64 = self.kept.values().map(|c| c.count).sum();
        // What was drained is in this report too; a report that does not
        // clear (SIGUSR1) shows counts the next one shows again.
        if clear {
            self.total += n + drained;
            self.seen = self.total;
        } else {
            self.seen = self.total + n + drained;
        }
        let mut v = self.kept.merged(read, clear);
        v.sort_by(|a, b| (a.0.index, b.1.count).cmp(&(b.0.index, a.1.count)));
        let stamp = if self.interval().is_some() {
            format!("{} ", clock())
        } else {
            String::new()
        };
        if self.mode != 0 {
            for (i, sel) in self.selected.iter().enumerate() {
                let reports = self.stack_reports(s, clear, &v, i as u32);
                out.stacks("count_stack", &format!("{stamp}{}", sel.label()), &reports);
            }
            return Ok(());
        }
        let top = self.args.top.unwrap_or(usize::MAX);
        let mut rows = Vec::new();
        let mut rest = crate::output::Rest {
            what: "rows",
            ..Default::default()
        };
        let all: Vec<&(CountKey, CountVal)> = v.iter().collect();
        for i in 0..self.selected.len() as u32 {
            let mine = keys::rows_of(&self.cols, i, &all);
            if mine.is_empty() && self.cols.is_empty() {
                // funccount lists every tracepoint matched, silent ones too.
                rows.push(self.row(i, Vec::new(), 0, 0));
            }
            for (n, (cells, count, sum)) in mine.into_iter().enumerate() {
                if n < top {
                    rows.push(self.row(i, cells, count, sum));
                } else {
                    rest.items += 1;
                    rest.count += count;
                }
            }
        }
        out.table(
            "count",
            &format!("{stamp}{}", self.what()),
            &self.header(),
            &rows,
        );
        if rest.items > 0 {
            out.rest("count", &rest);
        }
        Ok(())
    }

    fn drain(&mut self, s: &mut Traced) -> Result<usize> {
        Ok(self.kept.add(s.read_counts(COUNTS, true)?))
    }

    fn events(&self) -> u64 {
        self.seen
    }
}
