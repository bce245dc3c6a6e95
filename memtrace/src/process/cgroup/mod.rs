//! Memory cgroups as their files show them, v1 and v2: usage, limits up the
//! hierarchy, memory.stat, memory.events (v1: failcnt and oom_control), PSI,
//! and which group a path or a process names. Parsers are pure functions
//! over the files' text; `Group` reads the files.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

mod find;
pub mod notify;

pub use find::{hierarchies, limited_groups, resolve};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Version {
    V1,
    V2,
}

/// v1 reports "no limit" as a huge page-rounded number.
const V1_UNLIMITED: u64 = 1 << 62;

/// A limit file's value: `max` (v2) or a huge number (v1) is none.
pub fn parse_limit(text: &str) -> Option<u64> {
    let v: u64 = text.trim().parse().ok()?;
    (v < V1_UNLIMITED).then_some(v)
}

/// `key value` lines (memory.stat, memory.events, oom_control).
pub fn parse_keyed(text: &str) -> HashMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.to_string(), f.next()?.parse().ok()?))
        })
        .collect()
}

/// Memory by kind, in bytes, the group and its descendants together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemStat {
    pub anon: u64,
    pub file: u64,
    pub shmem: u64,
}

pub fn parse_stat(text: &str, v: Version) -> MemStat {
    let k = parse_keyed(text);
    let g = |n: &str| k.get(n).copied().unwrap_or(0);
    match v {
        // v1: the `total_` keys are hierarchical, as usage is; shmem is
        // counted in cache, and rss is anonymous memory.
        Version::V1 => MemStat {
            anon: g("total_rss"),
            file: g("total_cache").saturating_sub(g("total_shmem")),
            shmem: g("total_shmem"),
        },
        // v2: `file` includes shmem.
        Version::V2 => MemStat {
            anon: g("anon"),
            file: g("file").saturating_sub(g("shmem")),
            shmem: g("shmem"),
        },
    }
}

/// Counts of limit events, the group and its descendants together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Events {
    /// v2 `high`: over memory.high, throttled.
    pub high: u64,
    /// v2 `max` / v1 `failcnt`: a charge hit the limit.
    pub max: u64,
    /// v2 `oom`: the limit was hit and reclaim failed.
    pub oom: u64,
    pub oom_kill: u64,
}

impl Events {
    /// What happened since `start`.
    pub fn since(&self, start: &Events) -> Events {
        Events {
            high: self.high.saturating_sub(start.high),
            max: self.max.saturating_sub(start.max),
            oom: self.oom.saturating_sub(start.oom),
            oom_kill: self.oom_kill.saturating_sub(start.oom_kill),
        }
    }
}

/// v2 memory.events.
pub fn parse_events_v2(text: &str) -> Events {
    let k = parse_keyed(text);
    let g = |n: &str| k.get(n).copied().unwrap_or(0);
    Events {
        high: g("high"),
        max: g("max"),
        oom: g("oom"),
        oom_kill: g("oom_kill"),
    }
}

/// v1 failure counts (memory.failcnt and memory.memsw.failcnt, one per
/// line: a charge fails on whichever limit it hits first) and memory.oom_control.
pub fn parse_events_v1(failcnts: &str, oom_control: &str) -> Events {
    let k = parse_keyed(oom_control);
    Events {
        high: 0,
        max: failcnts
            .lines()
            .filter_map(|l| l.trim().parse::<u64>().ok())
            .sum(),
        oom: 0,
        oom_kill: k.get("oom_kill").copied().unwrap_or(0),
    }
}

/// The `avg10` of the `some` and `full` lines of a PSI file.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Psi {
    pub some_avg10: f64,
    pub full_avg10: f64,
}

pub fn parse_psi(text: &str) -> Option<Psi> {
    let avg10 = |kind: &str| -> Option<f64> {
        let line = text.lines().find(|l| l.starts_with(kind))?;
        line.split_whitespace()
            .find_map(|w| w.strip_prefix("avg10="))?
            .parse()
            .ok()
    };
    Some(Psi {
        some_avg10: avg10("some ")?,
        full_avg10: avg10("full ").unwrap_or(0.0),
    })
}

/// The memory cgroup paths of a process in /proc/PID/cgroup: (v1, v2),
/// as shown (bytes that are not UTF-8 written `\xNN`).
pub fn parse_proc_cgroup(text: &[u8]) -> (Option<String>, Option<String>) {
    let (v1, v2) = proc_cgroup_paths(text);
    (v1.map(|p| shown(&p)), v2.map(|p| shown(&p)))
}

/// The memory cgroup paths of a process in /proc/PID/cgroup, as the kernel
/// has them: a group's name is any bytes but '/' and NUL.
pub(super) fn proc_cgroup_paths(text: &[u8]) -> (Option<OsString>, Option<OsString>) {
    let (mut v1, mut v2) = (None, None);
    for l in text.split(|&b| b == b'\n') {
        let mut f = l.splitn(3, |&b| b == b':');
        let (Some(_), Some(ctl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let path = OsString::from_vec(path.to_vec());
        if ctl.is_empty() {
            v2 = Some(path);
        } else if ctl.split(|&b| b == b',').any(|c| c == b"memory") {
            v1 = Some(path);
        }
    }
    (v1, v2)
}

/// A path as text: as it is when it is UTF-8, else with each byte that is
/// not written `\xNN` (group names are bytes; shown, never dropped).
pub fn shown(raw: &OsStr) -> String {
    let bytes = raw.as_bytes();
    if let Ok(s) = std::str::from_utf8(bytes) {
        return s.to_string();
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// A memory cgroup: its hierarchy's mount point and its path inside it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Group {
    pub root: PathBuf,
    /// "/" for the root, "/a/b" below it, as shown (`shown`).
    pub path: String,
    /// The path as the kernel has it: what opens its files.
    raw: OsString,
    pub version: Version,
}

impl Group {
    /// The group at `path` in the hierarchy mounted at `root`.
    pub fn at(root: PathBuf, path: String) -> Group {
        let version = if root.join("memory.usage_in_bytes").exists() {
            Version::V1
        } else {
            Version::V2
        };
        Group::in_hierarchy(root, path.into(), version)
    }

    /// The group at the kernel's path `raw` ("/", "/a/b") under `root`.
    pub fn in_hierarchy(root: PathBuf, raw: OsString, version: Version) -> Group {
        // Trailing and doubled slashes dropped.
        let mut raw: PathBuf = Path::new("/").join(raw).components().collect();
        if raw.as_os_str().is_empty() {
            raw = PathBuf::from("/");
        }
        let raw = raw.into_os_string();
        Group {
            root,
            path: shown(&raw),
            raw,
            version,
        }
    }

    pub fn dir(&self) -> PathBuf {
        let rel = Path::new(&self.raw);
        self.root.join(rel.strip_prefix("/").unwrap_or(rel))
    }

    fn read(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(self.dir().join(file)).ok()
    }

    /// Kernfs id: the inode of its directory, as the kernel programs see it.
    pub fn id(&self) -> u64 {
        std::fs::metadata(self.dir()).map_or(0, |m| m.ino())
    }

    pub fn is_root(&self) -> bool {
        self.path == "/"
    }

    pub fn parent(&self) -> Option<Group> {
        if self.is_root() {
            return None;
        }
        let up = Path::new(&self.raw).parent().unwrap_or(Path::new("/"));
        Some(Group::in_hierarchy(
            self.root.clone(),
            up.as_os_str().to_owned(),
            self.version,
        ))
    }

    /// The group whose memory this one's processes are charged to: itself,
    /// or on v2 the nearest ancestor with the memory controller enabled
    /// (a v2 group without it is no memory cgroup).
    pub fn charged_to(self) -> Group {
        let mut g = self;
        while g.version == Version::V2 && !g.is_root() && !g.dir().join("memory.current").exists() {
            match g.parent() {
                Some(p) => g = p,
                None => break,
            }
        }
        g
    }

    /// Its own limit, if it has one (the root never has).
    pub fn limit(&self) -> Option<u64> {
        let f = match self.version {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        };
        parse_limit(&self.read(f)?)
    }

    pub fn usage(&self) -> Option<u64> {
        let f = match self.version {
            Version::V1 => "memory.usage_in_bytes",
            Version::V2 => "memory.current",
        };
        self.read(f)?.trim().parse().ok()
    }

    /// The limit in force: the smallest on the way up to the root (the
    /// nearest on a tie), with the group that sets it. The way up ends at a
    /// v1 parent without `memory.use_hierarchy` (kernels before 5.11): its
    /// children's memory is not charged to it.
    pub fn limiting(&self) -> Option<(u64, Group)> {
        let mut best: Option<(u64, Group)> = None;
        let mut g = Some(self.clone());
        while let Some(cur) = g {
            if let Some(l) = cur.limit() {
                if best.as_ref().is_none_or(|(b, _)| l < *b) {
                    best = Some((l, cur.clone()));
                }
            }
            g = cur.parent().filter(Group::charges_children);
        }
        best
    }

    /// Whether its children's memory counts against its limit: always on
    /// v2, and on v1 unless `memory.use_hierarchy` says 0.
    fn charges_children(&self) -> bool {
        self.version == Version::V2
            || self
                .read("memory.use_hierarchy")
                .is_none_or(|v| v.trim() != "0")
    }

    pub fn stat(&self) -> MemStat {
        parse_stat(&self.read("memory.stat").unwrap_or_default(), self.version)
    }

    /// Limit events of the group and its descendants. v1 counts an OOM
    /// kill in the victim's own group only: summed over the subtree here,
    /// as v2's memory.events does.
    pub fn events(&self) -> Events {
        match self.version {
            Version::V1 => {
                let fails = ["memory.failcnt", "memory.memsw.failcnt"]
                    .map(|f| self.read(f).unwrap_or_default())
                    .join("\n");
                let mut e = parse_events_v1(&fails, "");
                e.oom_kill = self
                    .with_descendants()
                    .iter()
                    .map(|g| {
                        let oc = g.read("memory.oom_control").unwrap_or_default();
                        parse_events_v1("", &oc).oom_kill
                    })
                    .sum();
                e
            }
            Version::V2 => parse_events_v2(&self.read("memory.events").unwrap_or_default()),
        }
    }

    /// Memory pressure, where the kernel keeps it per group (v2 with PSI).
    pub fn psi(&self) -> Option<Psi> {
        match self.version {
            Version::V1 => None,
            Version::V2 => parse_psi(&self.read("memory.pressure")?),
        }
    }

    /// The processes in the group itself (not its descendants).
    pub fn procs(&self) -> Vec<u32> {
        self.read("cgroup.procs")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Itself and every group below it.
    pub fn with_descendants(&self) -> Vec<Group> {
        let mut out = vec![self.clone()];
        let mut i = 0;
        while i < out.len() && out.len() < 4096 {
            let g = out[i].clone();
            i += 1;
            let Ok(rd) = std::fs::read_dir(g.dir()) else {
                continue;
            };
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    let raw = Path::new(&g.raw).join(e.file_name());
                    out.push(Group::in_hierarchy(
                        g.root.clone(),
                        raw.into_os_string(),
                        g.version,
                    ));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
