//! The kernel side of the snapshot: which programs run, how they are set
//! up, and how their maps are emptied into `Snapshot` every interval.

use memtrace_common::{
    faults::FaultConfig,
    kind,
    names::{
        BRK_STACKS, EXEC_NAMES, FAULTS, FAULTS_PERF, FILE_FAULTS, MMAP_COUNTS, PROC_RECLAIM, RSS,
        RSS_CFG, RSS_OWNER, RSS_STAT, TOP_CFG, TOP_MMAP,
    },
    oom::OomEvent,
    reclaim::ReclaimConfig,
    top::{MmapCount, TopConfig},
};

use super::{OomKill, Snapshot};
use crate::error::Result;
use crate::session::attach::Probe;
use crate::session::records::{comm, record};
use crate::session::Prep;
use crate::session::{first_name, Fold};
use crate::stacks::Traced;

impl Fold for MmapCount {
    fn fold(vals: &[Self]) -> Self {
        MmapCount {
            calls: vals.iter().map(|v| v.calls).sum(),
            bytes: vals.iter().map(|v| v.bytes).sum(),
            comm: first_name(vals.iter().map(|v| v.comm)),
        }
    }
}

/// Keys of each per-process count map: the processes active in one
/// interval (emptied every interval), with room for bursts of churn.
const KEYS: u32 = 16384;

/// The programs behind the snapshot.
#[derive(Default)]
pub struct Counters;

impl Counters {
    pub fn probes(&self) -> Vec<Probe> {
        let mut p = crate::probes::counters::fault_probes();
        p.push(crate::probes::counters::brk_probe());
        p.push(crate::probes::counters::ffault_probe().optional());
        p.push(Probe::new("mmap calls").tracepoint(TOP_MMAP, "syscalls", "sys_enter_mmap"));
        p.extend(crate::probes::reclaim::reclaim_probes());
        p.push(Probe::new("rss changes").tracepoint(RSS_STAT, "kmem", "rss_stat"));
        p.extend(crate::probes::oom::probes());
        // The name each process takes at exec.
        p.push(crate::probes::follow::exec_probe());
        p
    }

    pub fn prepare(&self, k: &mut Prep) -> Result<()> {
        // No count-by-process slots: every interval empties the hash map
        // key by key (lookup-and-delete), which keeps each count exact.
        // A new count takes its process's memory cgroup, in the kernel.
        let cfg = FaultConfig {
            memcg: 1,
            ..Default::default()
        };
        crate::probes::counters::prepare_faults(k, cfg, KEYS)?;
        k.loader.max_entries(EXEC_NAMES, 4096);
        crate::probes::counters::prepare_brk(k)?;
        k.loader.max_entries(BRK_STACKS, KEYS);
        // FILES_SEEN stays at one entry: no file names are needed here.
        crate::probes::counters::prepare_ffaults(k, KEYS)?;
        let len = crate::probes::syscalls::arg_offsets(k, "sys_enter_mmap", ["len"])?[0];
        k.loader.global(
            TOP_CFG,
            &TopConfig {
                tp_mmap_len: len,
                _pad: 0,
            },
        );
        k.loader.max_entries(MMAP_COUNTS, KEYS);
        crate::probes::reclaim::prepare_reclaim(
            k,
            ReclaimConfig {
                per_process: 1,
                ..Default::default()
            },
        )?;
        k.loader
            .global(RSS_CFG, &crate::probes::rssstat::config(k, 0)?);
        k.loader.max_entries(RSS, KEYS);
        k.loader.max_entries(RSS_OWNER, KEYS);
        crate::probes::oom::prepare(k, false)
    }

    /// An OOM kill record; false for any other.
    pub fn on_record(&self, data: &[u8], snap: &mut Snapshot) -> bool {
        let Some(ev) = record::<OomEvent>(data, kind::OOM) else {
            return false;
        };
        let mut victim_comm = comm(&ev.victim_comm);
        if victim_comm.is_empty() {
            victim_comm = crate::process::proc::comm(ev.victim_pid).unwrap_or_default();
        }
        let cgroup = crate::kernel::cgroupid::path_of(ev.memcg_id)
            .map(|(_, p)| p)
            .unwrap_or_else(|| "/".into());
        // The victim is often gone before its cgroup can be read from /proc:
        // the kill names it.
        let p = snap.proc_mut(ev.victim_pid, &victim_comm);
        if p.cgroup.is_empty() {
            p.cgroup.clone_from(&cgroup);
        }
        snap.oom(OomKill {
            at: std::time::SystemTime::now(),
            victim_pid: ev.victim_pid,
            victim_comm,
            trigger_pid: ev.trigger_pid,
            cgroup,
            anon_rss_kb: ev.anon_rss_kb,
        });
        true
    }

    /// Empties the count maps into `snap`: one interval. Returns the
    /// events it counted (every view's event total).
    pub fn read(&self, s: &mut Traced, snap: &mut Snapshot) -> Result<u64> {
        snap.begin();
        let gen = s.next_generation()?;
        let mut faults = s.take_counts(FAULTS, gen)?;
        faults.extend(s.take_counts(FAULTS_PERF, gen)?);
        for (k, v) in faults {
            // A process gone before /proc could say its group keeps the one
            // the kernel saw it in (a live one's /proc group is newer: it
            // may have moved since its first fault).
            let cg = snap.cgroup_path(v.memcg_id);
            let p = snap.proc_mut(k.tgid, &comm(&v.comm));
            if p.cgroup.is_empty() {
                p.cgroup = cg;
            }
            if k.kernel_mode == 0 {
                p.last.faults_user += v.count;
            } else {
                p.last.faults_kernel += v.count;
            }
        }
        for (k, v) in s.take_counts(BRK_STACKS, gen)? {
            let p = snap.proc_mut(k.tgid, &comm(&v.comm));
            p.last.brk_calls += v.count;
            p.last.brk_bytes += v.bytes;
        }
        for (k, n) in s.take_counts(FILE_FAULTS, gen)? {
            snap.proc_mut(k.tgid, "").last.file_faults += n;
        }
        for (k, v) in s.take_counts(MMAP_COUNTS, gen)? {
            let p = snap.proc_mut(k.tgid, &comm(&v.comm));
            p.last.mmap_calls += v.calls;
            p.last.mmap_bytes += v.bytes;
        }
        for (k, v) in s.take_counts(PROC_RECLAIM, gen)? {
            snap.proc_mut(k.tgid, &comm(&v.comm)).last.reclaim_ns += v.ns;
        }
        let mut gone = Vec::new();
        for (tgid, v) in s.hash_entries(RSS) {
            if !crate::process::proc::alive(tgid) {
                gone.push(tgid);
            }
            let p = snap.proc_mut(tgid, &comm(&v.comm));
            let before = p.resident();
            p.rss = v.bytes;
            if p.rss_read {
                p.rss_growth = p.resident() - before;
            }
            p.rss_read = true;
        }
        // The kernel keeps an entry per process ever seen: the gone ones
        // are dropped here, or the maps would fill under churn.
        for tgid in &gone {
            s.hash_remove(RSS, tgid)?;
        }
        let owners: Vec<u32> = s
            .hash_entries(RSS_OWNER)
            .into_iter()
            .filter(|(_, tgid)| !crate::process::proc::alive(*tgid))
            .map(|(mm, _)| mm)
            .collect();
        for mm in owners {
            s.hash_remove(RSS_OWNER, &mm)?;
        }
        // Names taken at exec: a count keeps the name of its first event,
        // often the parent's before the child's exec. Applied at every
        // read while the process lives and dropped once it is gone (pids
        // are reused): dropping an entry once read lost a second exec's
        // name written between the read and the drop (a test's child execs
        // sh, which execs the workload: its faults went under "sh").
        // A process gone before /proc could say its group takes the one it
        // exec'd in (its first faults may come before it was moved there).
        // Kept a few seconds past the process in the snapshot (`learned`),
        // for a process whose counts come after its exec was read.
        for (pid, (name, memcg)) in crate::probes::follow::exec_identities(s) {
            // Marked gone at an earlier read (which looked at /proc).
            let gone = match snap.procs.get(&pid) {
                Some(p) => p.gone.is_some(),
                None => !crate::process::proc::alive(pid),
            };
            // Applied already, and still running: nothing new.
            if !gone {
                if let Some(l) = snap.learned.get_mut(&pid).filter(|l| l.0 == name) {
                    l.2 = std::time::Instant::now();
                    continue;
                }
            }
            let cg = match crate::process::proc::exiting(pid) {
                true => snap.cgroup_path(memcg),
                false => String::new(),
            };
            if let Some(p) = snap.procs.get_mut(&pid) {
                p.comm.clone_from(&name);
                if !cg.is_empty() {
                    p.cgroup.clone_from(&cg);
                }
            }
            snap.learned
                .insert(pid, (name, cg, std::time::Instant::now()));
            if gone {
                s.hash_remove(EXEC_NAMES, &pid)?;
            }
        }
        let mut events = 0;
        for p in snap.procs.values_mut() {
            let last = p.last;
            p.total.add(&last);
            events += last.activity();
        }
        snap.end();
        Ok(events)
    }
}
