//! The cost of `memcg --heap` to a process in the watched group: the same
//! timed loop as memleak's, run in a memory cgroup memtrace watches (the
//! tracer is not the loop's parent here, so it runs beside it).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::tracer::{go_and_time, memtrace, workload};

/// A memory cgroup without a limit, removed on drop.
struct Group(PathBuf);

impl Group {
    fn new() -> Option<Group> {
        let v1 = PathBuf::from("/sys/fs/cgroup/memory");
        let root = if v1.join("memory.limit_in_bytes").exists() {
            v1
        } else {
            PathBuf::from("/sys/fs/cgroup")
        };
        let p = root.join(format!("memtrace-bench-heap-{}", std::process::id()));
        std::fs::create_dir_all(&p).ok()?;
        Some(Group(p))
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The loop's own time in ns under `memtrace memcg --heap EXTRA...` watching
/// the group it runs in, or None.
pub(super) fn once(lp: &str, pairs: u64, extra: &[String]) -> Option<f64> {
    let g = Group::new()?;
    let name = format!("/{}", g.0.file_name()?.to_str()?);
    let mut tracer = Command::new(memtrace())
        .args(["memcg", "--cgroup", &name, "--heap", "-v"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    // Attached once it says it traces.
    let mut err = BufReader::new(tracer.stderr.take()?);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut line = String::new();
    while Instant::now() < deadline {
        line.clear();
        if err.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line.starts_with("Tracing") {
            break;
        }
    }
    // The loop waits in the group until memtrace has taken it in: the shim
    // loaded (said with -v), or at once with uprobes.
    let procs = g.0.join("cgroup.procs");
    let mut c = Command::new(workload());
    c.args(["--wait", lp, &pairs.to_string()]);
    // SAFETY: only a write(2) between fork and exec.
    unsafe {
        c.pre_exec(move || std::fs::write(&procs, std::process::id().to_string()));
    }
    let mut w = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .ok()?;
    let mut lines = BufReader::new(w.stdout.take()?).lines();
    lines.next()?.ok()?;
    if !extra.iter().any(|a| a == "--no-inject") {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            line.clear();
            if err.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if line.contains("point at the shim") {
                break;
            }
        }
    }
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    let ns = go_and_time(&mut w, lines);
    let _ = Command::new("kill")
        .args(["-INT", &tracer.id().to_string()])
        .status();
    let _ = tracer.wait();
    ns
}
