//! Reading /proc: every file memtrace reads there is parsed here, once.

/// The fields of /proc/PID/stat memtrace reads, from one read. The command
/// name may hold spaces and parentheses: fields are counted after its last
/// ')'.
struct Stat {
    state: String,
    ppid: u32,
    flags: u64,
    /// Clock ticks since boot.
    start_time: u64,
}

const PF_EXITING: u64 = 0x4;
const PF_KTHREAD: u64 = 0x0020_0000;

fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = text.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&text[close + 1..]).ok()?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(Stat {
        state: f.first()?.to_string(),
        ppid: f.get(1)?.parse().ok()?,
        flags: f.get(6)?.parse().ok()?,
        start_time: f.get(19)?.parse().ok()?,
    })
}

/// Whether `pid` is gone or tearing down its memory (PF_EXITING).
pub fn exiting(pid: u32) -> bool {
    stat(pid).is_none_or(|s| s.flags & PF_EXITING != 0)
}

/// Why process `pid` has nothing a tool could trace, if so: a kernel thread
/// (PF_KTHREAD: no user memory), a zombie (exited, waiting for its parent)
/// or one already exiting.
pub fn untraceable(pid: u32) -> Option<&'static str> {
    let s = stat(pid)?;
    if s.flags & PF_KTHREAD != 0 {
        Some("a kernel thread: it has no user memory to trace")
    } else if s.state == "Z" || s.state == "X" {
        Some("a zombie: it has exited and waits for its parent")
    } else if s.flags & PF_EXITING != 0 {
        Some("exiting: it is tearing down its memory")
    } else {
        None
    }
}

/// A kernel `dev_t` as the kernel programs read it (12 bits major, 20 minor)
/// split into (major, minor) as /proc/PID/maps shows it.
pub fn split_dev(kdev: u32) -> (u32, u32) {
    (kdev >> 20, kdev & 0xfffff)
}

/// Whether process `pid` still exists.
pub fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Whether `pid` has exited: gone, or a zombie not reaped yet (whose
/// memory is gone: a probe on it fails with ESRCH).
pub fn exited(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // The state follows the comm's closing parenthesis.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, r)| r.trim_start().chars().next());
    matches!(state, Some('Z' | 'X'))
}

/// The memory cgroup path of `pid`: in the v1 memory hierarchy where one
/// is mounted (hybrid hosts), else in the v2 hierarchy.
pub fn cgroup_of(pid: u32) -> String {
    let Ok(text) = std::fs::read(format!("/proc/{pid}/cgroup")) else {
        return String::new();
    };
    let (v1, v2) = crate::process::cgroup::parse_proc_cgroup(&text);
    v1.or(v2).unwrap_or_default()
}

/// The memory counters of /proc/PID/status, in bytes (0 where absent);
/// None for a process gone, or without memory of its own (a kernel
/// thread has no VmRSS line).
#[derive(Debug, Clone, Copy, Default)]
pub struct Status {
    pub rss_file: i64,
    pub rss_anon: i64,
    pub rss_shmem: i64,
    pub swap: i64,
}

pub fn status(pid: u32) -> Option<Status> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |key: &str| -> i64 {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<i64>().ok())
            .unwrap_or(0)
            * 1024
    };
    text.lines()
        .any(|l| l.starts_with("VmRSS:"))
        .then(|| Status {
            rss_file: kb("RssFile:"),
            rss_anon: kb("RssAnon:"),
            rss_shmem: kb("RssShmem:"),
            swap: kb("VmSwap:"),
        })
}

/// The name of process `pid` (its comm), if it is still there.
pub fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// The parent of process `pid`.
pub fn parent_of(pid: u32) -> Option<u32> {
    stat(pid).map(|s| s.ppid)
}

/// The process thread `tid` belongs to (/proc finds threads by id too).
pub fn tgid_of(tid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))?
        .trim()
        .parse()
        .ok()
}

/// When `pid` started (clock ticks since boot): with the pid, a process's
/// identity, since pids are reused.
pub fn start_time(pid: u32) -> Option<u64> {
    stat(pid).map(|s| s.start_time)
}

/// `start_time` and whether it is exiting (PF_EXITING), from one read.
pub fn started_and_exiting(pid: u32) -> Option<(u64, bool)> {
    stat(pid).map(|s| (s.start_time, s.flags & PF_EXITING != 0))
}

/// Every process id in /proc now.
pub fn pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

// Mounts are the kernel wing's (tracefs and cgroup filesystems are found
// through them): parsed there, and read through here like any /proc file.
pub use crate::kernel::mounts::{mounts, parse_mounts};

/// MemTotal from /proc/meminfo, in kB.
pub fn mem_total_kb() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// The OOM killer's score of `pid` (/proc/PID/oom_score: its badness,
/// oom_score_adj included), if it is still there.
pub fn oom_score(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/oom_score"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The host's memory at a glance: available, swap used, and memory
/// pressure (PSI some/full avg10, where the kernel has it).
pub fn memory_line() -> String {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kb = |key: &str| -> Option<u64> {
        info.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    };
    let mib = |k: Option<u64>| k.map_or("-".to_string(), |k| format!("{}", k >> 10));
    let swap_used = kb("SwapTotal:")
        .zip(kb("SwapFree:"))
        .map(|(t, f)| t.saturating_sub(f));
    let psi = std::fs::read_to_string("/proc/pressure/memory")
        .ok()
        .and_then(|t| crate::process::cgroup::parse_psi(&t))
        .map_or("-".to_string(), |p| {
            format!("some {:.2} full {:.2}", p.some_avg10, p.full_avg10)
        });
    format!(
        "mem available {} of {} MiB  swap used {} of {} MiB  pressure {psi}",
        mib(kb("MemAvailable:")),
        mib(kb("MemTotal:")),
        mib(swap_used),
        mib(kb("SwapTotal:")),
    )
}

/// /proc/loadavg as the kernel writes it.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn dev_t_split() {
        // 254:1 (virtio disk) as the kernel encodes it.
        assert_eq!(super::split_dev((254 << 20) | 1), (254, 1));
    }

    #[test]
    fn mount_points_with_escaped_spaces() {
        let m = super::parse_mounts(
            "sysfs /sys sysfs rw,nosuid 0 0\n\
             tmpfs /sys/kernel/tracing tmpfs rw 0 0\n\
             tmpfs /mnt/a\\040b tmpfs rw 0 0\n",
        );
        assert_eq!(
            m[1],
            ("tmpfs".into(), "/sys/kernel/tracing".into(), "rw".into())
        );
        assert_eq!(m[2].1, std::path::PathBuf::from("/mnt/a b"));
        assert_eq!(m[0].2, "rw,nosuid");
    }
}

/// One mapping of /proc/PID/smaps with its Rss and Pss.
#[derive(Debug, Clone, Default)]
pub struct SmapsEntry {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    pub name: String,
    pub rss: u64,
    pub pss: u64,
}

pub fn parse_smaps(text: &str) -> Vec<SmapsEntry> {
    let mut out: Vec<SmapsEntry> = Vec::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let Some(first) = it.next() else { continue };
        if let Some((s, e)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) {
                let perms = it.next().unwrap_or("").to_string();
                let name = it.skip(3).collect::<Vec<_>>().join(" ");
                out.push(SmapsEntry {
                    start,
                    end,
                    perms,
                    name,
                    ..Default::default()
                });
                continue;
            }
        }
        let kb = || {
            it.clone()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                * 1024
        };
        match (first, out.last_mut()) {
            ("Rss:", Some(m)) => m.rss = kb(),
            ("Pss:", Some(m)) => m.pss = kb(),
            _ => {}
        }
    }
    out
}

/// The mappings of `pid` with their Rss and Pss; empty when unreadable.
pub fn smaps(pid: u32) -> Vec<SmapsEntry> {
    // Bytes: a path that is not UTF-8 must not empty the whole list.
    std::fs::read(format!("/proc/{pid}/smaps"))
        .map(|t| parse_smaps(&String::from_utf8_lossy(&t)))
        .unwrap_or_default()
}

/// Every descendant of `root` alive now, found through /proc.
pub fn descendants(root: u32) -> Vec<u32> {
    let parents: std::collections::HashMap<u32, u32> = pids()
        .into_iter()
        .filter_map(|p| Some((p, parent_of(p)?)))
        .collect();
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (&child, _) in parents.iter().filter(|(_, &pp)| pp == p) {
            out.push(child);
            frontier.push(child);
        }
    }
    out.sort_unstable();
    out
}
