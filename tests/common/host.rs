//! What this host offers, for tests that depend on it: they check here and
//! skip with a printed reason where a feature is missing (or, for the tests
//! of memtrace's refusals, present). And a memory cgroup on either cgroup
//! version.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use super::{run_with, wait_child};

/// Whether program `bin` is installed and answers `bin ARG` (`--version`,
/// `-V`) successfully.
pub fn installed(bin: &str, arg: &str) -> bool {
    std::process::Command::new(bin)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Prints why a test does not run here; the test then returns. Written to
/// stderr directly, past the test harness's capture, so that it shows, and
/// appended to `MEMTRACE_SKIP_LOG` (set by `cargo xtask test`), so that the
/// closing line counts skips apart from passes and names their reasons.
pub fn skip(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
    if let Some(log) = std::env::var_os("MEMTRACE_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(log)
        {
            let _ = writeln!(f, "{test}: {why}");
        }
    }
}

pub fn kprobes() -> bool {
    Path::new("/sys/bus/event_source/devices/kprobe/type").exists()
}

/// Whether the kernel loads and attaches fentry programs, as `memtrace
/// doctor` finds out (asked once per test binary).
pub fn fentry() -> bool {
    static FENTRY: OnceLock<bool> = OnceLock::new();
    *FENTRY.get_or_init(|| {
        let out = run_with(&["doctor"], Duration::from_secs(120));
        out.stdout.lines().any(|l| {
            l.strip_prefix("fentry ")
                .is_some_and(|r| r.split_whitespace().next() == Some("yes"))
        })
    })
}

/// Whether any swap area is active (`/proc/swaps` lists more than its header).
pub fn swap_on() -> bool {
    std::fs::read_to_string("/proc/swaps").is_ok_and(|s| s.lines().count() > 1)
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// Where memory cgroups are made here: the v2 hierarchy when it has the
/// memory controller (enabled for its children), else the v1 one.
pub fn memcg_root() -> Option<(PathBuf, CgroupVersion)> {
    static ROOT: OnceLock<Option<(PathBuf, CgroupVersion)>> = OnceLock::new();
    ROOT.get_or_init(|| {
        for dir in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
            let dir = Path::new(dir);
            let has_memory = std::fs::read_to_string(dir.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|w| w == "memory"));
            if has_memory {
                let sub = dir.join("cgroup.subtree_control");
                let on = std::fs::read_to_string(&sub)
                    .is_ok_and(|c| c.split_whitespace().any(|w| w == "memory"));
                if on || std::fs::write(&sub, "+memory").is_ok() {
                    return Some((dir.to_path_buf(), CgroupVersion::V2));
                }
            }
        }
        let v1 = Path::new("/sys/fs/cgroup/memory");
        v1.join("memory.limit_in_bytes")
            .exists()
            .then(|| (v1.to_path_buf(), CgroupVersion::V1))
    })
    .clone()
}

/// A memory cgroup with a limit, removed on drop.
pub struct Memcg {
    pub path: PathBuf,
    /// Its name, which is also its path in the hierarchy after the `/`.
    pub name: String,
    pub version: CgroupVersion,
}

impl Memcg {
    /// Limited to `limit`, swap included: it reclaims and OOM-kills the same
    /// with or without swap on the host.
    pub fn new(tag: &str, limit: &str) -> Memcg {
        Self::make(tag, limit, false)
    }

    /// Limited to `limit` in memory, free to swap beyond it.
    pub fn swappable(tag: &str, limit: &str) -> Memcg {
        Self::make(tag, limit, true)
    }

    fn make(tag: &str, limit: &str, swap: bool) -> Memcg {
        Self::named(
            &format!("memtrace-test-{tag}-{}", std::process::id()),
            limit,
            swap,
        )
    }

    /// Named `name` under the root, as a runtime would name it (the
    /// caller makes it unique).
    pub fn named(name: &str, limit: &str, swap: bool) -> Memcg {
        let (root, version) = memcg_root().expect("no memory cgroup controller (v1 or v2)");
        let name = name.to_string();
        let path = root.join(&name);
        std::fs::create_dir_all(&path).expect("create memcg");
        let cg = Memcg {
            path,
            name,
            version,
        };
        // Files a kernel may lack (swap accounting off) are left alone.
        match version {
            CgroupVersion::V1 => {
                cg.write("memory.limit_in_bytes", limit);
                if !swap {
                    let _ = std::fs::write(cg.path.join("memory.memsw.limit_in_bytes"), limit);
                }
            }
            CgroupVersion::V2 => {
                cg.write("memory.max", limit);
                if !swap {
                    let _ = std::fs::write(cg.path.join("memory.swap.max"), "0");
                }
            }
        }
        cg
    }

    fn write(&self, file: &str, value: &str) {
        std::fs::write(self.path.join(file), value)
            .unwrap_or_else(|e| panic!("{}/{file} = {value}: {e}", self.path.display()));
    }

    /// No memory limit any more.
    pub fn lift(&self) {
        match self.version {
            CgroupVersion::V1 => self.write("memory.limit_in_bytes", "-1"),
            CgroupVersion::V2 => self.write("memory.max", "max"),
        }
    }

    /// The workload growing its heap 1 MiB from malloc every 10 ms in this
    /// group until the OOM killer takes it: its pid.
    pub fn grow_until_killed(&self) -> u32 {
        use std::os::unix::process::ExitStatusExt;
        let mut child = self
            .command(&super::workload_bin())
            .args(["heap-steps", "1", "1000", "10"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let st = wait_child(&mut child, super::WAIT);
        assert_eq!(st.signal(), Some(libc::SIGKILL), "not OOM-killed: {st:?}");
        child.id()
    }

    /// A command that joins this cgroup before it execs.
    pub fn command(&self, program: &Path) -> Command {
        use std::os::unix::process::CommandExt;
        let procs = self.path.join("cgroup.procs");
        let mut c = Command::new(program);
        // SAFETY: only a write(2) between fork and exec.
        unsafe {
            c.pre_exec(move || {
                std::fs::write(&procs, format!("{}", std::process::id()))?;
                Ok(())
            });
        }
        c
    }
}

impl Drop for Memcg {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.path).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Runs `cmd` to its end within `timeout` (killed and a panic past it).
pub fn status_within(cmd: &mut Command, timeout: Duration) -> std::process::ExitStatus {
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    wait_child(&mut child, timeout)
}
