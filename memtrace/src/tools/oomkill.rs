//! `memtrace oomkill`: one line per OOM kill, as BCC's oomkill prints, with
//! the victim's RSS split, its memory cgroup and the pages considered.

use memtrace_common::{
    kind, method,
    oom::*,
    reclaim::{ReclaimConfig, ReclaimEvent},
    stack_mode,
};

use memtrace_common::names;

use crate::error::Result;
use crate::kernel::{btf::page_size, cgroupid};
use crate::output::{clock, Col, Printer, Row, StackReport, Value};
use crate::probes::heap::watch::HeapWatch;
use crate::run::tool::{About, Prep, Tool};
use crate::session::attach::Probe;
use crate::session::records::{comm, record};
use crate::stacks::Traced;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::run::args::Common,
    /// Add the kernel and user stacks of the task that triggered the kill:
    /// the victim's own where it triggered it (the kernel lets BPF read the
    /// user stack of the current task only).
    #[arg(long)]
    pub stack: bool,
    /// Track every process's heap (memleak's allocator probes, sampled;
    /// with -p, the process's): each kill shows what the victim held, by
    /// stack. Every allocator call on the host takes a uprobe's trap.
    #[arg(long)]
    pub heap: bool,
    /// With --heap: one sample per N bytes allocated on average (each
    /// weighted by the inverse of its chance: an unbiased estimate); 0
    /// records every allocation.
    #[arg(long, value_name = "BYTES", default_value = "512K", value_parser = crate::stacks::args::parse_size, requires = "heap")]
    pub heap_sample: u64,
    #[command(flatten)]
    pub stacks: crate::stacks::args::StackArgs,
}

pub fn probes() -> Vec<Probe> {
    crate::probes::oom::probes()
}

/// With `--stack`: reclaim comes before an OOM kill (a memcg at its limit,
/// or the system short of memory), and the task in it is who the kill will
/// name or be triggered by. Its maps are read then, while it is alive: by
/// the time the kill is reported the victim may be gone, and its frames
/// with it. Optional: kills are reported without them.
fn prefetch_probes() -> Vec<Probe> {
    crate::probes::reclaim::reclaim_probes()
        .into_iter()
        .map(Probe::optional)
        .collect()
}

/// A process's maps are read again at most this often while it fails reclaim.
const PREFETCH_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

const COLS: [Col; 18] = [
    Col::text("time", "TIME", 8),
    Col::num("trigger_pid", "TPID", 7),
    Col::text("trigger_comm", "TCOMM", 15),
    Col::num("victim_pid", "VPID", 7),
    Col::text("victim_comm", "VCOMM", 15),
    Col::num("anon_rss_kb", "ANON_KB", 9),
    Col::num("file_rss_kb", "FILE_KB", 8),
    Col::num("shmem_rss_kb", "SHMEM_KB", 8),
    Col::num("total_vm_kb", "TOTALVM_KB", 10),
    Col::num("uid", "UID", 5),
    Col::num("oom_score_adj", "ADJ", 5),
    Col::num("pages", "PAGES", 9),
    Col::text("pages_source", "PAGES_FROM", 11),
    Col::text("memcg", "MEMCG", 20),
    Col::text("limit_at", "LIMIT_AT", 20),
    Col::num("limit_kb", "LIMIT_KB", 10),
    Col::text("loadavg", "LOADAVG", 22),
    Col::text("method", "VIA", 10),
];

pub struct Oomkill {
    stack: bool,
    stack_args: crate::stacks::args::StackArgs,
    kills: u64,
    /// With `--stack`: kills whose victim's own stack was captured (it
    /// triggered the kill), and those where it was out of reach.
    victim_stacks: u64,
    victim_unreachable: u64,
    /// When each process failing reclaim last had its maps read.
    prefetched: std::collections::HashMap<u32, std::time::Instant>,
    /// `-p`/`-c`: only kills whose victim or trigger is this process (or
    /// one it forked, with `--children`). Kills are rare: filtered here.
    target: Option<u32>,
    heap: Option<HeapWatch>,
}

impl Oomkill {
    pub fn new(a: &Args) -> Result<Self> {
        Ok(Oomkill {
            stack: a.stack,
            stack_args: a.stacks.clone(),
            kills: 0,
            victim_stacks: 0,
            victim_unreachable: 0,
            prefetched: Default::default(),
            target: None,
            heap: a.heap.then(|| HeapWatch::new(a.heap_sample, false)),
        })
    }
}

fn method_name(m: u32) -> &'static str {
    match m {
        method::KPROBE => "kprobe",
        method::FENTRY => "fentry",
        method::TP_BTF => "tp_btf",
        method::RAW_TP => "raw_tp",
        _ => "tracepoint",
    }
}

/// The cgroup level whose limit was hit, and that limit: the OOM's own
/// memcg where the way in sees it (`oom_control.memcg`), else the smallest
/// limit on the way up from the victim's group. None: a system-wide OOM.
fn limiting_level(
    ev: &OomEvent,
    memcg: Option<&(std::path::PathBuf, String)>,
) -> Option<(u64, crate::process::cgroup::Group)> {
    let (root, path) = memcg.filter(|(_, p)| p != "/")?;
    let g = crate::process::cgroup::Group::at(root.clone(), path.clone());
    if ev.memcg_source == 1 {
        return g.limit().map(|l| (l, g));
    }
    g.limiting()
}

/// Whether the victim is the task that triggered the kill (or another
/// thread of its process): the only case where its user stack can be read,
/// since the kill runs in the triggering task's context. The classic
/// tracepoint names the victim by thread id.
fn victim_triggered(ev: &OomEvent) -> bool {
    ev.victim_pid != 0
        && (ev.victim_pid == ev.trigger_pid
            || ev.victim_tid == ev.trigger_tid
            || ev.victim_pid == ev.trigger_tid)
}

impl Oomkill {
    /// Reads the maps of a process in reclaim. Not only reclaim that freed
    /// nothing: on 6.1 the last ones before a memcg OOM still freed a few
    /// pages (the workload's own file pages).
    fn prefetch(&mut self, r: &ReclaimEvent, s: &mut Traced) {
        let now = std::time::Instant::now();
        if self
            .prefetched
            .get(&r.pid)
            .is_some_and(|t| now.duration_since(*t) < PREFETCH_EVERY)
        {
            return;
        }
        s.sym.maps.lock().unwrap().snapshot(r.pid);
        self.prefetched
            .retain(|_, t| now.duration_since(*t) < PREFETCH_EVERY);
        self.prefetched.insert(r.pid, now);
    }
}

impl Oomkill {
    /// With --heap: the processes traced (-p's and its children, or every
    /// one) that are new since the last look: their maps are read while
    /// they live, and a new allocator is probed.
    fn follow(&mut self, s: &mut Traced) -> Result<()> {
        let Some(h) = self.heap.as_mut() else {
            return Ok(());
        };
        let (pids, settle) = match self.target {
            Some(t) => {
                let mut v = vec![t];
                v.extend(s.hash_keys(names::FOLLOWED));
                (v, false)
            }
            None => (crate::process::proc::pids(), true),
        };
        h.follow(s, &pids, settle)
    }

    /// With --heap: what the victim held, by stack.
    fn victim_heap(
        &mut self,
        ev: &OomEvent,
        victim: &str,
        s: &mut Traced,
        out: &mut dyn Printer,
    ) -> Result<()> {
        let Some(h) = self.heap.as_mut() else {
            return Ok(());
        };
        let title = format!(
            "Heap held by the victim, PID {} ({victim}), at the kill, by stack",
            ev.victim_pid
        );
        h.report(s, &[ev.victim_pid].into(), "oom_heap", &title, out)
    }
}

fn mem_total_pages() -> u64 {
    crate::process::proc::mem_total_kb().map_or(0, |kb| kb * 1024 / page_size())
}

pub const ABOUT: About = About {
    name: "oomkill",
    help: "OOM kills: trigger, victim, RSS, memcg, pages considered",
    traces: "OOM kills",
    interval: None,
};

impl Tool for Oomkill {
    fn about(&self) -> &'static About {
        &ABOUT
    }
    fn probes(&self) -> Vec<Probe> {
        let mut p = probes();
        if self.stack {
            p.extend(prefetch_probes());
        }
        if let Some(h) = &self.heap {
            p.extend(h.probes());
        }
        p
    }

    fn user_stacks(&self) -> Option<(&crate::stacks::args::StackArgs, bool)> {
        // OOM kills are rare: the trigger's stack is copied whole; sampled
        // allocations are not.
        (self.stack || self.heap.is_some()).then_some((&self.stack_args, self.heap.is_none()))
    }
    fn stack_mode(&self) -> u32 {
        let heap = if self.heap.is_some() {
            stack_mode::USER
        } else {
            0
        };
        if self.stack {
            stack_mode::USER | stack_mode::KERNEL
        } else {
            heap
        }
    }

    fn prepare(&mut self, k: &mut Prep) -> Result<()> {
        self.target = k.target;
        if let Some(h) = self.heap.as_mut() {
            let pids = k
                .target
                .map_or_else(crate::process::proc::pids, |t| vec![t]);
            h.prepare(k.loader, k.stacks, &pids)?;
            // Every process's execs and executable mappings come through
            // the ring buffer (for the stacks of processes gone by a kill):
            // a host starting 2,000 a second overran 1 MiB, not 16.
            // --buffer-size still decides.
            k.loader.max_entries(names::EVENTS, 16 << 20);
        }
        if self.stack {
            let cfg = ReclaimConfig {
                emit_events: 1,
                ..Default::default()
            };
            crate::probes::reclaim::prepare_reclaim(k, cfg)?;
        }
        crate::probes::oom::prepare(k, self.stack)
    }

    fn on_record(&mut self, data: &[u8], s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        if let Some(r) = record::<ReclaimEvent>(data, kind::RECLAIM) {
            self.prefetch(&r, s);
            return Ok(());
        }
        let Some(ev) = record::<OomEvent>(data, kind::OOM) else {
            return Ok(());
        };
        if let Some(t) = self.target {
            let ours = |p: u32| p == t || s.hash_get(names::FOLLOWED, &p).is_some();
            if !ours(ev.victim_pid) && !ours(ev.trigger_pid) {
                return Ok(());
            }
        }
        self.kills += 1;
        // The trigger is often the victim and dies right after: read its
        // maps (in user_frames) before anything slower, or its user stack
        // cannot be symbolized.
        let user = if self.stack {
            s.thread_user_frames(ev.trigger_pid, Some(ev.trigger_tid), ev.ustack, 0)
        } else {
            Vec::new()
        };
        let mut victim_comm = comm(&ev.victim_comm);
        if victim_comm.is_empty() {
            victim_comm = crate::process::proc::comm(ev.victim_pid).unwrap_or_default();
        }
        let memcg = cgroupid::path_of(ev.memcg_id);
        let limit = memcg
            .as_ref()
            .filter(|(_, p)| p != "/")
            .and_then(|(root, p)| cgroupid::memory_limit(&root.join(p.trim_start_matches('/'))));
        let (pages, source) = if ev.totalpages > 0 {
            (ev.totalpages, "oom_control")
        } else if let Some(l) = limit {
            (l / page_size(), "memcg_limit")
        } else {
            (mem_total_pages(), "system")
        };
        let (limit_at, limit_kb) = match limiting_level(&ev, memcg.as_ref()) {
            Some((l, g)) => (Value::S(g.path), Value::U(l / 1024)),
            None => (Value::Null, Value::Null),
        };
        let loadavg = crate::process::proc::loadavg();
        let loadavg: Vec<&str> = loadavg.split_whitespace().take(4).collect();
        let row = Row(vec![
            clock().into(),
            ev.trigger_pid.into(),
            comm(&ev.trigger_comm).into(),
            ev.victim_pid.into(),
            victim_comm.clone().into(),
            ev.anon_rss_kb.into(),
            ev.file_rss_kb.into(),
            ev.shmem_rss_kb.into(),
            ev.total_vm_kb.into(),
            ev.uid.into(),
            ev.oom_score_adj.into(),
            pages.into(),
            source.into(),
            memcg.map(|(_, p)| Value::S(p)).unwrap_or(Value::Null),
            limit_at,
            limit_kb,
            loadavg.join(" ").into(),
            method_name(ev.method).into(),
        ]);
        if !self.stack {
            out.event("oom_kill", &COLS, &row);
            return self.victim_heap(&ev, &victim_comm, s, out);
        }
        let own = victim_triggered(&ev);
        let mut cols = COLS.to_vec();
        cols.push(Col::text("stack_of", "STACK_OF", 8));
        let mut row = row;
        row.0.push(if own { "victim" } else { "trigger" }.into());
        out.event("oom_kill", &cols, &row);
        self.victim_heap(&ev, &victim_comm, s, out)?;
        let failed = (ev.ustack == -1 && ev.kstack < 0).then(|| "stack capture failed".to_string());
        let (title, note) = if own {
            self.victim_stacks += 1;
            (
                "The victim's stack (it triggered the kill)".to_string(),
                failed,
            )
        } else {
            self.victim_unreachable += 1;
            let why = format!(
                "the victim's own stack is unreachable: {} ({}) did not trigger the kill, and only the current task's user stack can be read",
                ev.victim_pid, victim_comm
            );
            (
                format!("The triggering task's stack (victim {})", ev.victim_pid),
                Some(match failed {
                    Some(f) => format!("{f}; {why}"),
                    None => why,
                }),
            )
        };
        let report = StackReport {
            pid: ev.trigger_pid,
            comm: comm(&ev.trigger_comm),
            count: 1,
            kernel: s.kernel_frames(ev.kstack),
            user,
            note,
            ..Default::default()
        };
        out.stacks("oom_stack", &title, &[report]);
        Ok(())
    }

    fn on_start(&mut self, s: &mut Traced) -> Result<()> {
        self.follow(s)
    }

    fn forget_exited(&mut self, s: &mut Traced) -> Result<usize> {
        self.follow(s)?;
        match self.heap.as_mut() {
            Some(h) => h.forget_exited(s),
            None => Ok(0),
        }
    }

    fn events(&self) -> u64 {
        self.kills
    }

    fn summary_extra(&self) -> Vec<(&'static str, Value)> {
        let mut v = Vec::new();
        if self.stack {
            v.push(("victim_stacks", Value::U(self.victim_stacks)));
            v.push((
                "victim_stack_unreachable",
                Value::U(self.victim_unreachable),
            ));
        }
        v.extend(self.heap.iter().flat_map(HeapWatch::summary));
        v
    }
}
