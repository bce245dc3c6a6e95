//! `memtrace rss`: a process's RSS from the kernel's own counter changes
//! (kmem:rss_stat) instead of polling pmap: per interval anon, file, shmem
//! and swap with peaks, and a threshold checked in the kernel at the change
//! that crosses it, with the allocating stack and a pmap-like breakdown.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use memtrace_common::{
    kind,
    rss::{RssCross, RssExit, RssVal, ANON, FILE, SHMEM},
    stack_mode,
};

use memtrace_common::names;

use crate::error::{Error, Result};
use crate::output::{Printer, Value};
use crate::run::args::IntervalArgs;
use crate::run::tool::{About, Prep, Tool};
use crate::session::attach::Probe;
use crate::session::records::record;
use crate::stacks::args::parse_size;
use crate::stacks::Traced;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::run::args::Common,
    #[command(flatten)]
    pub stacks: crate::stacks::args::StackArgs,
    /// Seconds between reports (default 1), and how many.
    #[command(flatten)]
    pub interval: IntervalArgs,
    /// Report the moment RSS (less excluded mappings) exceeds this (e.g. 512M, 5MiB, 1G).
    #[arg(long, value_parser = parse_size)]
    pub threshold: Option<u64>,
    /// Leave mappings out of the threshold sum: by name (substring of the
    /// path, e.g. guest_mem or [heap]) or by exact size (e.g. 128MiB). Repeatable.
    #[arg(long)]
    pub exclude: Vec<String>,
    /// Exit with code 3 if the threshold was crossed.
    #[arg(long)]
    pub fail: bool,
    /// Drop processes that exited without a last row (they always leave
    /// the table and its TOTAL).
    #[arg(long)]
    pub hide_exited: bool,
}

pub fn probes() -> Vec<Probe> {
    vec![
        Probe::new("rss changes").tracepoint(names::RSS_STAT, "kmem", "rss_stat"),
        // Each process's last figures as it exits, however short it lived.
        Probe::new("process exits").tracepoint(names::RSS_EXIT, "sched", "sched_process_exit"),
        // The name each process took at exec, for its rows and exit row.
        crate::probes::follow::exec_probe(),
    ]
}

pub struct Rss {
    args: Args,
    excludes: Vec<Exclude>,
    crossed: bool,
    /// Over the threshold already when tracing started: reported with the
    /// first table (the kernel only sees changes, and an idle process may
    /// make none).
    over_at_start: Option<RssCross>,
    target: u32,
    /// Processes reported so far, and how many of them exited.
    seen: std::collections::HashSet<u32>,
    exited: u64,
    /// Process rows and threshold crossings printed: the summary's events.
    shown: u64,
    /// The processes listed, by pid and start time.
    born: seed::Born,
    /// Exit records since the last report: each its last row.
    exits: Vec<(u32, RssVal)>,
    /// Processes whose last row came from their row marked exited, read
    /// before their exit record arrived: that record has nothing more to
    /// say (it was a second last row).
    ended_early: std::collections::HashSet<u32>,
    /// Rows of no process memtrace follows (a pid reused before it was let
    /// go): left out, and counted.
    unattributed: u64,
}

impl Rss {
    pub fn new(a: &Args) -> Result<Self> {
        if a.common.pid.is_none() && a.common.command.is_none() {
            return Err(Error::Usage("rss needs -p PID or -c CMD".into()));
        }
        if a.fail && a.threshold.is_none() {
            return Err(Error::Usage("--fail needs --threshold".into()));
        }
        Ok(Rss {
            excludes: a.exclude.iter().map(|s| Exclude::parse(s)).collect(),
            args: a.clone(),
            crossed: false,
            over_at_start: None,
            target: 0,
            seen: Default::default(),
            exited: 0,
            ended_early: Default::default(),
            shown: 0,
            born: Default::default(),
            exits: Vec::new(),
            unattributed: 0,
        })
    }

    fn read(&self, s: &Traced) -> Result<Vec<(u32, RssVal)>> {
        let mut v = s.hash_entries(names::RSS);
        v.sort_by_key(|(p, _)| *p);
        Ok(v)
    }

    /// Recomputes the excluded bytes of each traced process for the kernel.
    fn refresh_excluded(&self, s: &mut Traced, pids: &[u32]) -> Result<HashMap<u32, u64>> {
        let mut out = HashMap::new();
        if self.excludes.is_empty() {
            return Ok(out);
        }
        for &pid in pids {
            let ex = excluded_bytes(&crate::process::proc::smaps(pid), &self.excludes);
            s.hash_insert(names::RSS_EXCLUDED, pid, ex, 0)?;
            out.insert(pid, ex);
        }
        Ok(out)
    }

    /// Forgets processes that exited: their counters, their exclusions and
    /// the mms they owned, so that neither the table nor the maps keep them.
    fn forget(&mut self, s: &mut Traced, pids: &HashSet<u32>) -> Result<()> {
        if pids.is_empty() {
            return Ok(());
        }
        for pid in pids {
            s.hash_remove(names::RSS, pid)?;
            s.hash_remove(names::RSS_EXCLUDED, pid)?;
            // A pid reused later must not take this process's exec name.
            s.hash_remove(names::EXEC_NAMES, pid)?;
            // Pids are reused: a new process under an old pid is a new row
            // to count.
            self.seen.remove(pid);
            self.born.0.remove(pid);
            self.exited += 1;
        }
        let owned: Vec<u32> = s
            .hash_entries(names::RSS_OWNER)
            .into_iter()
            .filter(|(_, owner)| pids.contains(owner))
            .map(|(mm, _)| mm)
            .collect();
        for mm in owned {
            s.hash_remove(names::RSS_OWNER, &mm)?;
        }
        Ok(())
    }
}

pub const ABOUT: About = About {
    name: "rss",
    help: "RSS of a process from the kernel's counter changes, with a threshold guard",
    traces: "RSS changes",
    interval: Some(Duration::from_secs(1)),
};

impl Tool for Rss {
    fn about(&self) -> &'static About {
        &ABOUT
    }
    fn probes(&self) -> Vec<Probe> {
        probes()
    }
    fn intervals(&self) -> Option<&IntervalArgs> {
        Some(&self.args.interval)
    }
    fn user_stacks(&self) -> Option<(&crate::stacks::args::StackArgs, bool)> {
        // Crossing the threshold happens once: its stack is copied whole.
        self.args
            .threshold
            .is_some()
            .then_some((&self.args.stacks, true))
    }
    fn stack_mode(&self) -> u32 {
        if self.args.threshold.is_some() {
            stack_mode::USER | stack_mode::KERNEL
        } else {
            0
        }
    }

    fn prepare(&mut self, k: &mut Prep) -> Result<()> {
        self.target = k.target.unwrap_or(0);
        let cfg = crate::probes::rssstat::config(k, self.args.threshold.unwrap_or(0))?;
        k.loader.global(names::RSS_CFG, &cfg);
        let exit = crate::probes::rssstat::exit_config(k)?;
        k.loader.global(names::RSS_EXIT_CFG, &exit);
        k.loader.max_entries(names::RSS, 4096);
        k.loader.max_entries(names::RSS_OWNER, 4096);
        k.loader.max_entries(names::RSS_EXCLUDED, 4096);
        k.loader.max_entries(names::EXEC_NAMES, 4096);
        Ok(())
    }

    fn on_record(&mut self, data: &[u8], s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        if let Some(ev) = record::<RssExit>(data, kind::RSS_EXIT) {
            // Marked exited: the name it had at exit, the figures as it left.
            let v = RssVal {
                bytes: ev.bytes,
                peak: ev.peak,
                comm: ev.comm,
                ..Default::default()
            };
            if !self.ended_early.remove(&ev.pid) {
                self.exits.push((ev.pid, v));
            }
            return Ok(());
        }
        let Some(ev) = record::<RssCross>(data, kind::RSS_CROSS) else {
            return Ok(());
        };
        self.print_cross(s, out, &ev, false)
    }

    fn on_start(&mut self, s: &mut Traced) -> Result<()> {
        // The kernel only reports changes: seed the counters with what the
        // process already has, read from /proc at the same moment.
        // Exclusions known before the first change, so the threshold never
        // counts an excluded mapping that is already there.
        // With --children, its descendants too (adopted into FOLLOWED just
        // before): idle ones would never show, busy ones with one counter.
        let mut pids = vec![self.target];
        pids.extend(
            s.hash_entries(names::FOLLOWED)
                .into_iter()
                .map(|(p, _)| p)
                .filter(|p| *p != self.target),
        );
        let excluded = self.refresh_excluded(s, &pids)?;
        let ex = excluded.get(&self.target).copied().unwrap_or(0);
        let (threshold, target) = (self.args.threshold, self.target);
        let mut over = None;
        self.born.seed_into(s, target, |seed| {
            let rss = seed.bytes[FILE] + seed.bytes[ANON] + seed.bytes[SHMEM];
            if threshold.is_some_and(|t| rss - ex as i64 > t as i64) {
                // Over already: the kernel must not report it again.
                seed.crossed = 1;
                over = Some(RssCross {
                    kind: kind::RSS_CROSS,
                    pid: target,
                    task_pid: target,
                    task_tid: target,
                    bytes: seed.bytes,
                    excluded: ex,
                    ustack: -1,
                    kstack: -1,
                    comm: seed.comm,
                    task_comm: seed.comm,
                });
            }
        })?;
        self.over_at_start = over;
        for p in pids.into_iter().skip(1) {
            self.born.seed_into(s, p, |_| {})?;
        }
        Ok(())
    }

    /// The table shows the counters as they stand, not what changed.
    fn report(&mut self, s: &mut Traced, out: &mut dyn Printer, _clear: bool) -> Result<()> {
        self.table(s, out)
    }

    /// Rows printed (a process each, per report) and threshold crossings:
    /// the counter changes themselves are not sent up.
    fn events(&self) -> u64 {
        self.shown
    }

    fn summary_extra(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("threshold_crossed", Value::U(self.crossed as u64)),
            ("processes", Value::U(self.seen.len() as u64 + self.exited)),
            ("processes_exited", Value::U(self.exited)),
            ("processes_unattributed", Value::U(self.unattributed)),
        ]
    }

    fn exit_code(&self) -> i32 {
        if self.args.fail && self.crossed {
            3
        } else {
            0
        }
    }
}

mod cross;
mod exclude;
mod seed;
mod table;
use exclude::{excluded_bytes, Exclude};

#[cfg(test)]
mod tests;
