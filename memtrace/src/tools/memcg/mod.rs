//! `memtrace memcg`: memory cgroups before the OOM kill. One row per group
//! (usage, the limit in force and the level that sets it, memory by kind,
//! PSI, limit events and OOM kills since start, reclaim stall time), and
//! with `--warn` an event-driven warning at the crossing that names the
//! processes that grew most, with the stack of their latest allocations.

use std::collections::{HashMap, HashSet, VecDeque};

use std::time::{Duration, Instant};

use memtrace_common::{
    kind,
    memcg::{MemcgCross, MemcgOffsets, MemcgProc},
    names,
    reclaim::ReclaimConfig,
    stack_mode,
};

use crate::error::{Error, Result};
use crate::output::{Printer, Value};
use crate::probes::heap::watch::HeapWatch;
use crate::probes::reclaim::{prepare_reclaim, reclaim_probes};
use crate::process::cgroup::{notify::Poller, Events, Group, Psi};
use crate::run::args::IntervalArgs;
use crate::run::tool::{About, Prep, Tool};
use crate::session::attach::Probe;
use crate::session::records::record;
use crate::stacks::Traced;

pub use args::Args;

mod args;
mod heap;
mod oom;
mod prekill;
mod table;
mod warn;
mod watch;

/// How long the usage and pressure timeline goes back, and how often it is sampled.
const TIMELINE: Duration = Duration::from_secs(30);
const SAMPLE_EVERY: Duration = Duration::from_millis(500);
/// "Grew most in the last seconds": growth over this window.
const GROWTH_WINDOW: Duration = Duration::from_secs(5);
/// Poller tags: group index times this, plus what fired.
const TAGS: u64 = 4;
const TAG_USAGE: u64 = 0;
const TAG_EVENTS: u64 = 1;
const TAG_PRESSURE: u64 = 2;
/// A tenth of the limit crossed (v1): a point of the run-up. Which tenth
/// is in the tag's high half (`STEP_TENTH` times it): a notifier read late
/// still says the line it fired at, not the usage when it was read.
const TAG_STEP: u64 = 3;
const STEP_TENTH: u64 = 1 << 32;
const TAG_TIMER: u64 = u64::MAX;
const TAG_PREKILL: u64 = u64::MAX - 1;
const TAG_ARRIVALS: u64 = u64::MAX - 2;
/// How often --heap looks for processes new to the groups, to load the
/// shim into them: what a process allocates before it is loaded is not
/// seen (a sampling tick of 500 ms missed half of a 96 MiB group).
const ARRIVALS_EVERY: Duration = Duration::from_millis(10);

#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Instant,
    usage: u64,
    psi: Option<Psi>,
    /// Taken when usage crossed this percent of the limit (v1's notifier),
    /// not by the timer.
    step: Option<u8>,
}

struct Watched {
    group: Group,
    /// The limit in force and the group that sets it.
    limit: Option<(u64, Group)>,
    start: Events,
    /// Kernfs ids of the group and its descendants.
    ids: HashSet<u64>,
    warned: bool,
    timeline: VecDeque<Sample>,
}

impl Watched {
    fn threshold(&self, pct: f64) -> Option<u64> {
        self.limit
            .as_ref()
            .map(|(l, _)| (*l as f64 * pct / 100.0) as u64)
    }
}

pub struct Memcg {
    args: Args,
    groups: Vec<Watched>,
    poller: Option<Poller>,
    /// RSS of each process in a watched group, sampled.
    rss_history: HashMap<u32, VecDeque<(Instant, u64)>>,
    checked_start: bool,
    /// The groups over the warning line once their notifiers were armed:
    /// those are warned about "at start" (a v1 notifier fires at a
    /// crossing only); any other crosses later, and is warned about by
    /// what saw it cross.
    over_at_start: Vec<bool>,
    warnings: u64,
    kills: u64,
    rows: u64,
    hook: Option<prekill::Hook>,
    prekills: u64,
    heap: Option<HeapWatch>,
    /// The groups and their descendants as last walked (`sample`).
    walked: Vec<crate::process::cgroup::Group>,
}

impl Memcg {
    pub fn new(a: &Args) -> Result<Self> {
        if a.fail && a.warn.is_none() && a.warn_pressure.is_none() {
            return Err(Error::Usage(
                "--fail needs --warn or --warn-pressure".into(),
            ));
        }
        let groups = if a.cgroups.is_empty() {
            crate::process::cgroup::limited_groups()
        } else {
            let mut v = Vec::new();
            for c in &a.cgroups {
                let g = crate::process::cgroup::resolve(c)?;
                let to = g.clone().charged_to();
                if to != g {
                    say!(
                        "memtrace: {} has no memory controller: watching {}, where its memory is charged",
                        g.path,
                        to.path
                    );
                }
                v.push(to);
            }
            v
        };
        if groups.is_empty() {
            say!("memtrace: no memory cgroup has a limit here; name groups with --cgroup");
        }
        let hook = match a.prekill {
            true => Some(prekill::Hook::listen(&a.prekill_dir).map_err(|e| {
                Error::Usage(format!(
                    "cannot listen for systemd-oomd's prekill calls in {}: {e}",
                    a.prekill_dir.display()
                ))
            })?),
            false => None,
        };
        if let Some(h) = &hook {
            say!(
                "memtrace: answering systemd-oomd's prekill calls at {} (systemd 260+ with PrekillHookTimeoutSec= in oomd.conf calls it)",
                h.path().display()
            );
        }
        let groups = groups
            .into_iter()
            .map(|g| Watched {
                limit: g.limiting(),
                start: g.events(),
                ids: HashSet::new(),
                warned: false,
                timeline: VecDeque::new(),
                group: g,
            })
            .collect();
        Ok(Memcg {
            args: a.clone(),
            groups,
            poller: None,
            rss_history: HashMap::new(),
            checked_start: false,
            over_at_start: Vec::new(),
            warnings: 0,
            kills: 0,
            rows: 0,
            hook,
            prekills: 0,
            heap: match a.heap {
                true => Some(HeapWatch::new(a.heap_sample, true).shimmed(
                    !a.no_inject,
                    "memcg",
                    a.common.verbose,
                )?),
                false => None,
            },
            walked: Vec::new(),
        })
    }

    /// Whether growth is followed (warnings, and the prekill answer).
    fn warning(&self) -> bool {
        self.args.warn.is_some() || self.args.warn_pressure.is_some() || self.args.prekill
    }

    /// Whether the kernel checks the limiting groups' usage at allocations
    /// (the warning line, and on v2 the run-up's steps): for a warning, and
    /// for the heap report's run-up.
    fn runup_events(&self) -> bool {
        self.warning() || self.heap.is_some()
    }
}

/// RSS (file + anon + shmem) of a followed process, in bytes.
fn rss(v: &MemcgProc) -> u64 {
    use memtrace_common::rss::{ANON, FILE, SHMEM};
    (v.bytes[FILE] + v.bytes[ANON] + v.bytes[SHMEM]).max(0) as u64
}

pub const ABOUT: About = About {
    name: "memcg",
    help: "Memory cgroups: usage against the limit in force, pressure, events, and a warning before the OOM kill",
    traces: "memory cgroups",
    interval: None,
};

impl Tool for Memcg {
    fn about(&self) -> &'static About {
        &ABOUT
    }
    fn what(&self) -> String {
        format!("{} memory cgroups", self.groups.len())
    }
    fn probes(&self) -> Vec<Probe> {
        let mut p = reclaim_probes();
        if self.warning() {
            p.push(Probe::new("rss changes in the groups").tracepoint(
                names::MEMCG_RSS,
                "kmem",
                "rss_stat",
            ));
        }
        if self.runup_events() {
            // Optional: the cgroup notifiers and samples warn without it.
            p.push(
                Probe::new("usage at allocations")
                    .tracepoint(names::MEMCG_LINE, "kmem", "rss_stat")
                    .optional(),
            );
        }
        if let Some(h) = &self.heap {
            p.extend(h.probes());
        }
        // Optional: the table and warnings work without it.
        p.extend(
            crate::probes::oom::probes()
                .into_iter()
                .map(Probe::optional),
        );
        p
    }
    fn intervals(&self) -> Option<&IntervalArgs> {
        Some(&self.args.interval)
    }
    fn user_stacks(&self) -> Option<(&crate::stacks::args::StackArgs, bool)> {
        // A stack per MiB of growth: frequent under a fast allocator.
        (self.warning() || self.heap.is_some()).then_some((&self.args.stacks, false))
    }
    fn stack_mode(&self) -> u32 {
        if self.warning() || self.heap.is_some() {
            stack_mode::USER
        } else {
            0
        }
    }

    fn prepare(&mut self, k: &mut Prep) -> Result<()> {
        if self.heap.is_some() {
            let pids = self.members();
            if let Some(h) = self.heap.as_mut() {
                h.prepare(k.loader, k.stacks, &pids)?;
            }
        }
        // The group of a stall is the stalled task's, read through BTF offsets.
        k.task_offsets()?;
        prepare_reclaim(
            k,
            ReclaimConfig {
                per_memcg: 1,
                ..Default::default()
            },
        )?;
        k.loader.max_entries(names::MEMCG_RECLAIM, 1024);
        crate::probes::oom::prepare(k, false)?;
        if self.runup_events() {
            k.loader.max_entries(names::MEMCG_WATCH, 1024);
            let cfg = crate::probes::rssstat::config(k, 0)?;
            k.loader.global(names::MEMCG_CFG, &cfg);
            k.loader.max_entries(names::MEMCG_PROCS, 4096);
            k.loader.max_entries(names::MEMCG_LINES, 1024);
            // To read a group's usage at each allocation in it; without
            // these offsets only the cgroup notifiers warn.
            let mut r = k.btf()?.resolver();
            let o = MemcgOffsets {
                css_parent: r.member("cgroup_subsys_state", "parent"),
                memcg_css: r.member("mem_cgroup", "css"),
                memcg_memory: r.member("mem_cgroup", "memory"),
                counter_usage: r.member("page_counter", "usage"),
                valid: 1,
            };
            match r.done("a memory cgroup's usage", o) {
                Ok(o) => {
                    k.loader.global(names::MEMCG_OFFS, &o);
                }
                Err(e) => say!("memtrace: no usage check at allocations: {e}"),
            }
        }
        Ok(())
    }

    fn on_start(&mut self, s: &mut Traced) -> Result<()> {
        if let Some(h) = self.heap.as_mut() {
            h.start()?;
        }
        self.sample(s)?;
        if self.runup_events() {
            self.set_lines(s)?;
        }
        self.arm()?;
        self.over_at_start = (0..self.groups.len())
            .map(|i| self.over_line(i).is_some())
            .collect();
        Ok(())
    }

    fn on_record(&mut self, data: &[u8], s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        if let Some(ev) = record::<MemcgCross>(data, kind::MEMCG_CROSS) {
            return self.on_cross(&ev, s, out);
        }
        if let Some(ev) = record::<MemcgCross>(data, kind::MEMCG_STEP) {
            self.kernel_step(&ev);
            return Ok(());
        }
        self.on_oom(data, s, out)
    }

    fn wakeup_fd(&self) -> Option<std::os::fd::RawFd> {
        self.poller.as_ref().map(Poller::fd)
    }

    fn on_wakeup(&mut self, s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        self.wakeup(s, out)
    }

    fn done(&self) -> bool {
        self.args.fail && self.warnings > 0
    }

    fn report(&mut self, s: &mut Traced, out: &mut dyn Printer, _clear: bool) -> Result<()> {
        self.table(s, out)
    }

    fn finish(&mut self, s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        // The processes' calls put back before the last table.
        if let Some(h) = self.heap.as_mut() {
            h.finish();
        }
        let per_interval = self.interval().is_some();
        self.report(s, out, per_interval)
    }

    /// Sample rows, warnings, prekill calls and OOM kills printed (a
    /// kill's timeline rows are its detail).
    fn events(&self) -> u64 {
        self.rows + self.warnings + self.kills + self.prekills
    }

    fn forget_exited(&mut self, s: &mut Traced) -> Result<usize> {
        match self.heap.as_mut() {
            Some(h) => h.forget_exited(s),
            None => Ok(0),
        }
    }

    fn summary_extra(&self) -> Vec<(&'static str, Value)> {
        let mut v = vec![
            ("groups", Value::U(self.groups.len() as u64)),
            ("warnings", Value::U(self.warnings)),
            ("oom_kills", Value::U(self.kills)),
            ("prekill_calls", Value::U(self.prekills)),
        ];
        v.extend(self.heap.iter().flat_map(HeapWatch::summary));
        v
    }

    fn exit_code(&self) -> i32 {
        if self.args.fail && self.warnings > 0 {
            3
        } else {
            0
        }
    }
}
