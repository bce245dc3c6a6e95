//! The series `serve` exposes, encoded by prometheus-client from the
//! snapshot, the bounded series and memtrace's own state.

use std::collections::HashMap;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Serve;
use crate::probes::snapshot::{Figures, OomKill};
use crate::stacks::Traced;

type Labels = Vec<(String, String)>;
type Counters = Family<Labels, Counter>;
type Seconds = Family<Labels, Counter<f64, std::sync::atomic::AtomicU64>>;
type Gauges = Family<Labels, Gauge>;

/// The label of "other" series.
pub const OTHER: &str = "other";

/// A cgroup's label: its path, "unknown" for processes gone before it
/// could be read.
pub fn cgroup_label(path: &str) -> String {
    if path.is_empty() {
        "unknown".into()
    } else {
        path.to_string()
    }
}

/// The labels of `pairs`, then of cgroup `path`: the path, the container
/// id and the pod uid it names (empty when none), so that series join the
/// cluster's by container and pod.
fn with_group(pairs: &[(&str, &str)], path: &str) -> Labels {
    let c = crate::process::container::of_cgroup(path);
    let id = c.as_ref().map_or("", |c| c.id.as_str());
    let pod = c.as_ref().and_then(|c| c.pod_uid.as_deref()).unwrap_or("");
    let mut out = l(pairs);
    out.extend(l(&[
        ("cgroup", &cgroup_label(path)),
        ("container_id", id),
        ("pod_uid", pod),
    ]));
    out
}

/// OOM kills by (victim name, cgroup), bounded like the other series.
pub struct State {
    ooms: HashMap<(String, String), u64>,
    max: usize,
}

impl State {
    pub fn new(max: usize) -> State {
        State {
            ooms: HashMap::new(),
            max,
        }
    }

    pub fn oom(&mut self, k: &OomKill) {
        let mut key = (k.victim_comm.clone(), k.cgroup.clone());
        if !self.ooms.contains_key(&key) && self.ooms.len() >= self.max {
            key = (OTHER.into(), OTHER.into());
        }
        *self.ooms.entry(key).or_default() += 1;
    }
}

fn l(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), visible(v)))
        .collect()
}

/// A label value with its control characters written out (`\x1b`): the
/// encoder escapes only newline, quote and backslash, and a process name
/// with an ESC in it reached terminals reading the page. Unlike text
/// output (`output::escape_controls`) backslashes stay single: cgroup
/// paths have them (systemd's `\x2d`) and a label is matched to its path.
fn visible(v: &str) -> String {
    if !v.chars().any(|c| c.is_control()) {
        return v.to_string();
    }
    v.chars()
        .map(|c| match c {
            c if c.is_control() => format!("\\x{:02x}", c as u32),
            c => c.to_string(),
        })
        .collect()
}

/// One family per figure, under a prefix ("memtrace" or "memtrace_cgroup").
struct FigureFamilies {
    faults: Counters,
    file_faults: Counters,
    brk_calls: Counters,
    brk_bytes: Counters,
    mmap_calls: Counters,
    mmap_bytes: Counters,
    reclaim: Seconds,
    rss: Gauges,
}

impl FigureFamilies {
    fn new(reg: &mut Registry, prefix: &str, per: &str) -> FigureFamilies {
        let f = FigureFamilies {
            faults: Family::default(),
            file_faults: Family::default(),
            brk_calls: Family::default(),
            brk_bytes: Family::default(),
            mmap_calls: Family::default(),
            mmap_bytes: Family::default(),
            reclaim: Family::default(),
            rss: Family::default(),
        };
        let name = |n: &str| format!("{prefix}_{n}");
        reg.register(
            name("page_faults"),
            format!("Page faults by {per} and mode (user, kernel)"),
            f.faults.clone(),
        );
        reg.register(
            name("file_faults"),
            format!("File-backed page faults by {per}"),
            f.file_faults.clone(),
        );
        reg.register(
            name("brk_calls"),
            format!("brk calls by {per}"),
            f.brk_calls.clone(),
        );
        reg.register(
            name("brk_bytes"),
            format!("Bytes the heap grew by through brk, by {per}"),
            f.brk_bytes.clone(),
        );
        reg.register(
            name("mmap_calls"),
            format!("mmap calls by {per}"),
            f.mmap_calls.clone(),
        );
        reg.register(
            name("mmap_bytes"),
            format!("Bytes asked for by mmap calls, by {per}"),
            f.mmap_bytes.clone(),
        );
        reg.register(
            name("reclaim_stall_seconds"),
            format!("Time stalled in direct and memcg reclaim, by {per}"),
            f.reclaim.clone(),
        );
        reg.register(
            name("rss_bytes"),
            format!("Resident memory by {per} and type (anon, file, shmem)"),
            f.rss.clone(),
        );
        f
    }

    fn add(&self, labels: &Labels, t: &Figures, rss: [u64; 3]) {
        let with = |k: &str, v: &str| {
            let mut x = labels.clone();
            x.push((k.into(), v.into()));
            x
        };
        self.faults
            .get_or_create(&with("mode", "user"))
            .inc_by(t.faults_user);
        self.faults
            .get_or_create(&with("mode", "kernel"))
            .inc_by(t.faults_kernel);
        self.file_faults.get_or_create(labels).inc_by(t.file_faults);
        self.brk_calls.get_or_create(labels).inc_by(t.brk_calls);
        self.brk_bytes.get_or_create(labels).inc_by(t.brk_bytes);
        self.mmap_calls.get_or_create(labels).inc_by(t.mmap_calls);
        self.mmap_bytes.get_or_create(labels).inc_by(t.mmap_bytes);
        self.reclaim
            .get_or_create(labels)
            .inc_by(t.reclaim_ns as f64 / 1e9);
        for (ty, v) in ["anon", "file", "shmem"].iter().zip(rss) {
            self.rss.get_or_create(&with("type", ty)).set(v as i64);
        }
    }
}

pub fn render(sv: &Serve, s: &Traced) -> String {
    let mut reg = Registry::default();
    let per_proc = FigureFamilies::new(&mut reg, "memtrace", "process");
    let per_cg = FigureFamilies::new(&mut reg, "memtrace_cgroup", "memory cgroup");
    let snap = &sv.snap;
    let mut other_rss = [0u64; 3];
    let mut cg_rss: HashMap<String, [u64; 3]> = HashMap::new();
    for p in snap.procs.values().filter(|p| p.gone.is_none()) {
        let rss = [p.rss_anon(), p.rss_file(), p.rss_shmem()];
        let cg = cgroup_label(&p.cgroup);
        let cg = if sv.cgroups.held.contains_key(&cg) {
            cg
        } else {
            OTHER.into()
        };
        let e = cg_rss.entry(cg).or_default();
        for i in 0..3 {
            e[i] += rss[i];
        }
        if !sv.procs.held.contains_key(&p.pid) {
            for i in 0..3 {
                other_rss[i] += rss[i];
            }
        }
    }
    for (pid, h) in &sv.procs.held {
        let Some(p) = snap.procs.get(pid) else {
            continue;
        };
        let rss = if p.gone.is_some() {
            [0; 3]
        } else {
            [p.rss_anon(), p.rss_file(), p.rss_shmem()]
        };
        let labels = with_group(&[("pid", &pid.to_string()), ("comm", &p.comm)], &p.cgroup);
        per_proc.add(&labels, &h.total, rss);
    }
    per_proc.add(
        &with_group(&[("pid", OTHER), ("comm", OTHER)], OTHER),
        &sv.procs.other,
        other_rss,
    );
    for (cg, h) in &sv.cgroups.held {
        per_cg.add(
            &with_group(&[], cg),
            &h.total,
            cg_rss.get(cg).copied().unwrap_or_default(),
        );
    }
    let other_cg = cg_rss.get(OTHER).copied().unwrap_or_default();
    per_cg.add(&with_group(&[], OTHER), &sv.cgroups.other, other_cg);

    let ooms: Counters = Family::default();
    reg.register(
        "memtrace_oom_kills",
        "OOM kills by victim name and memory cgroup",
        ooms.clone(),
    );
    for ((victim, cg), n) in &sv.state.ooms {
        ooms.get_or_create(&with_group(&[("victim", victim)], cg))
            .inc_by(*n);
    }
    let lost: Counters = Family::default();
    reg.register(
        "memtrace_lost_events",
        "Events memtrace lost in the kernel, by reason",
        lost.clone(),
    );
    for (reason, n) in s.losses() {
        lost.get_or_create(&l(&[("reason", reason)])).inc_by(n);
    }
    let attached: Gauges = Family::default();
    reg.register(
        "memtrace_probe_attached",
        "Probes attached (1), by probe and attach method",
        attached.clone(),
    );
    for (probe, method, _target) in &s.attached {
        attached
            .get_or_create(&l(&[("probe", probe), ("method", method)]))
            .set(1);
    }
    let tracked: Gauge = Gauge::default();
    reg.register(
        "memtrace_processes_tracked",
        "Processes memtrace holds figures for",
        tracked.clone(),
    );
    tracked.set(snap.procs.len() as i64);
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = encode(&mut out, &reg);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn control_characters_in_label_values_are_written_out() {
        assert_eq!(
            super::visible("a\x1b[31mb\n\u{7f}"),
            "a\\x1b[31mb\\x0a\\x7f"
        );
        assert_eq!(super::visible("bash"), "bash");
    }
}
