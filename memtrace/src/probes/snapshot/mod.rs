//! What `top` and `serve` show: per-process figures read every interval
//! from one session of existing counting programs (faults, brk, file
//! faults, reclaim per process, rss_stat, OOM kills) plus the mmap counter
//! of `top.rs`. Both views read the same `Snapshot`, so they agree.

mod read;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use memtrace_common::rss::{ANON, FILE, NR, SHMEM};

pub use read::Counters;

/// Cumulative (or per-interval) counts of one process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    pub faults_user: u64,
    pub faults_kernel: u64,
    pub file_faults: u64,
    pub brk_calls: u64,
    /// Bytes the heap grew by.
    pub brk_bytes: u64,
    pub mmap_calls: u64,
    /// Bytes the mmap calls asked for.
    pub mmap_bytes: u64,
    /// Time stalled in direct and memcg reclaim.
    pub reclaim_ns: u64,
}

impl Figures {
    pub fn add(&mut self, o: &Figures) {
        self.faults_user += o.faults_user;
        self.faults_kernel += o.faults_kernel;
        self.file_faults += o.file_faults;
        self.brk_calls += o.brk_calls;
        self.brk_bytes += o.brk_bytes;
        self.mmap_calls += o.mmap_calls;
        self.mmap_bytes += o.mmap_bytes;
        self.reclaim_ns += o.reclaim_ns;
    }

    /// Events in these figures, to rank processes by how busy they are
    /// (a millisecond of reclaim stall weighs as one event).
    pub fn activity(&self) -> u64 {
        self.faults_user
            + self.faults_kernel
            + self.file_faults
            + self.brk_calls
            + self.mmap_calls
            + self.reclaim_ns / 1_000_000
    }
}

/// One process as the views see it.
#[derive(Clone, Debug, Default)]
pub struct Proc {
    pub pid: u32,
    pub comm: String,
    /// Its memory cgroup path ("/" at the root, "" when it was gone before
    /// it could be read).
    pub cgroup: String,
    /// Since memtrace started (or since the process did).
    pub total: Figures,
    /// In the last interval.
    pub last: Figures,
    /// RSS counters in bytes (`rss::FILE`, `ANON`, `SWAP`, `SHMEM`).
    pub rss: [i64; NR],
    /// How much its resident memory (file, anon, shmem) changed in the last
    /// interval, in bytes; 0 in the interval it was first read in.
    pub rss_growth: i64,
    /// Whether its RSS was read before.
    pub rss_read: bool,
    /// The interval it was found gone in.
    pub gone: Option<u64>,
}

impl Proc {
    pub fn rss_anon(&self) -> u64 {
        self.rss[ANON].max(0) as u64
    }
    pub fn rss_file(&self) -> u64 {
        self.rss[FILE].max(0) as u64
    }
    pub fn rss_shmem(&self) -> u64 {
        self.rss[SHMEM].max(0) as u64
    }
    /// Resident bytes: file, anon and shmem (swap is not resident).
    pub fn resident(&self) -> i64 {
        self.rss[FILE] + self.rss[ANON] + self.rss[SHMEM]
    }
}

/// One OOM kill, as it happened.
#[derive(Clone, Debug)]
pub struct OomKill {
    pub at: SystemTime,
    pub victim_pid: u32,
    pub victim_comm: String,
    pub trigger_pid: u32,
    /// The memory cgroup the kill was in ("/" for a system-wide OOM).
    pub cgroup: String,
    pub anon_rss_kb: u64,
}

/// The most recent OOM kills kept for display.
const RECENT_OOMS: usize = 32;

/// Processes kept when more are known: the gone ones go first. Under heavy
/// churn this bounds memory whatever the interval.
pub const MAX_PROCS: usize = 32768;

/// Every process memtrace has figures for.
pub struct Snapshot {
    pub procs: HashMap<u32, Proc>,
    /// Length of the last interval.
    pub elapsed: Duration,
    /// Intervals read so far.
    pub tick: u64,
    /// Gone processes stay this many intervals, so their last counts show.
    pub keep_gone: u64,
    pub recent_ooms: VecDeque<OomKill>,
    /// OOM kills seen, with those not yet taken by a view (`take_ooms`).
    pub ooms: u64,
    new_ooms: Vec<OomKill>,
    /// Memory cgroup paths by kernfs id, each resolved once.
    cgroup_paths: HashMap<u64, String>,
    /// Names (and, for processes gone, groups) taken at exec, by pid, with
    /// when their process was last seen alive: a process whose counts
    /// arrive some refreshes after its exec was read still takes them.
    pub learned: HashMap<u32, (String, String, Instant)>,
    last_read: Instant,
}

/// How long a name learned at exec outlives its process.
const LEARNED_FOR: Duration = Duration::from_secs(5);

impl Snapshot {
    pub fn new(keep_gone: u64) -> Snapshot {
        Snapshot {
            procs: HashMap::new(),
            elapsed: Duration::from_secs(1),
            tick: 0,
            keep_gone,
            recent_ooms: VecDeque::new(),
            ooms: 0,
            new_ooms: Vec::new(),
            cgroup_paths: HashMap::new(),
            learned: HashMap::new(),
            last_read: Instant::now(),
        }
    }

    /// The entry of `pid`, made on first sight with its name and cgroup.
    pub fn proc_mut(&mut self, pid: u32, comm: &str) -> &mut Proc {
        // A pid seen gone and busy again is another process.
        if self
            .procs
            .get(&pid)
            .is_some_and(|p| p.gone.is_some() && crate::process::proc::alive(pid))
        {
            self.procs.remove(&pid);
        }
        let learned = self.learned.get(&pid).cloned();
        let p = self.procs.entry(pid).or_insert_with(|| Proc {
            pid,
            comm: if comm.is_empty() {
                crate::process::proc::comm(pid).unwrap_or_default()
            } else {
                comm.to_string()
            },
            // An exiting process shows the root group in /proc (v1 moves it
            // there as it exits): it has none to read any more.
            cgroup: match crate::process::proc::exiting(pid) {
                true => String::new(),
                false => crate::process::proc::cgroup_of(pid),
            },
            ..Default::default()
        });
        if let Some((name, cg, _)) = learned {
            p.comm = name;
            if !cg.is_empty() {
                p.cgroup = cg;
            }
        }
        p
    }

    /// The path of memory cgroup `id`, taken in the kernel at the event;
    /// "" for 0 or a group removed before it could be resolved.
    pub fn cgroup_path(&mut self, id: u64) -> String {
        if id == 0 {
            return String::new();
        }
        if let Some(p) = self.cgroup_paths.get(&id) {
            return p.clone();
        }
        let p = crate::kernel::cgroupid::path_of(id)
            .map(|(_, p)| p)
            .unwrap_or_default();
        if self.cgroup_paths.len() >= 4096 {
            self.cgroup_paths.clear();
        }
        self.cgroup_paths.insert(id, p.clone());
        p
    }

    /// Per-second rate of a figure over the last interval.
    pub fn rate(&self, v: u64) -> f64 {
        v as f64 / self.elapsed.as_secs_f64().max(1e-3)
    }

    /// `rate` of a change that may be negative.
    pub fn rate_signed(&self, v: i64) -> f64 {
        v as f64 / self.elapsed.as_secs_f64().max(1e-3)
    }

    pub fn oom(&mut self, k: OomKill) {
        self.ooms += 1;
        if self.recent_ooms.len() == RECENT_OOMS {
            self.recent_ooms.pop_front();
        }
        self.recent_ooms.push_back(k.clone());
        self.new_ooms.push(k);
    }

    /// OOM kills since the last call.
    pub fn take_ooms(&mut self) -> Vec<OomKill> {
        std::mem::take(&mut self.new_ooms)
    }

    /// Starts an interval: the per-interval figures restart from zero.
    fn begin(&mut self) {
        let now = Instant::now();
        self.elapsed = now - self.last_read;
        self.last_read = now;
        self.tick += 1;
        for p in self.procs.values_mut() {
            p.last = Figures::default();
            p.rss_growth = 0;
        }
    }

    /// Ends an interval: marks processes gone, forgets those gone long
    /// enough, and keeps the whole under `MAX_PROCS`.
    fn end(&mut self) {
        let tick = self.tick;
        let keep = self.keep_gone;
        for p in self.procs.values_mut() {
            if p.gone.is_none() && !crate::process::proc::alive(p.pid) {
                p.gone = Some(tick);
            }
        }
        self.procs
            .retain(|_, p| p.gone.is_none_or(|g| tick.saturating_sub(g) < keep));
        // A name learned at exec holds while its process lives, then
        // LEARNED_FOR more: its last counts may be read several refreshes
        // later (scrapes come back to back, and a count waits a grace period
        // to be drained; two refreshes let a process's 367 faults go under
        // the shell's name it had before its exec, in one CI run). A
        // pid reused after that is another process.
        let procs = &self.procs;
        let now = Instant::now();
        self.learned.retain(|pid, (_, _, at)| {
            if procs.get(pid).is_some_and(|p| p.gone.is_none()) || crate::process::proc::alive(*pid)
            {
                *at = now;
            }
            now.duration_since(*at) < LEARNED_FOR
        });
        if self.procs.len() > MAX_PROCS {
            let mut gone: Vec<(u64, u32)> = self
                .procs
                .values()
                .filter_map(|p| Some((p.gone?, p.pid)))
                .collect();
            gone.sort_unstable();
            let excess = self.procs.len() - MAX_PROCS;
            for (_, pid) in gone.into_iter().take(excess) {
                self.procs.remove(&pid);
            }
        }
    }

    /// Every process alive now, with its RSS from /proc (the kernel's
    /// counters arrive only as they change): what `top` starts from.
    pub fn seed_from_proc(&mut self) {
        for pid in crate::process::proc::pids() {
            self.seed(pid);
        }
    }

    /// Process `pid` with its RSS from /proc; kernel threads (no memory of
    /// their own) and processes already gone are left out.
    pub fn seed(&mut self, pid: u32) {
        let Some(st) = crate::process::proc::status(pid) else {
            return;
        };
        let rss = [st.rss_file, st.rss_anon, 0, st.rss_shmem];
        self.proc_mut(pid, "").rss = rss;
    }
}
