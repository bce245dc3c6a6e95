//! Cgroup paths from kernfs ids: a cgroup's kernfs id is the inode number of
//! its directory, in the v1 memory hierarchy or the unified (v2) one.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Mount points of the memory controller, v1 first.
pub fn memory_roots() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for (ty, at, options) in crate::kernel::mounts::with_options() {
        if ty == "cgroup" && options.split(',').any(|o| o == "memory") {
            out.insert(0, at);
        } else if ty == "cgroup2" {
            out.push(at);
        }
    }
    out
}

fn find(dir: &Path, ino: u64, depth: usize) -> Option<PathBuf> {
    if depth > 32 {
        return None;
    }
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        if !ft.is_dir() {
            continue;
        }
        let p = e.path();
        if e.metadata().map(|m| m.ino()).ok() == Some(ino) {
            return Some(p);
        }
        if let Some(found) = find(&p, ino, depth + 1) {
            return Some(found);
        }
    }
    None
}

/// The cgroup with kernfs id `id`: (hierarchy root, path inside it like "/a/b").
pub fn path_of(id: u64) -> Option<(PathBuf, String)> {
    if id == 0 {
        return None;
    }
    for root in memory_roots() {
        if std::fs::metadata(&root).map(|m| m.ino()).ok() == Some(id) {
            return Some((root, "/".into()));
        }
        if let Some(p) = find(&root, id, 0) {
            let rel = p.strip_prefix(&root).ok()?.to_string_lossy().into_owned();
            return Some((root, format!("/{rel}")));
        }
    }
    None
}

/// The memory limit of the cgroup at `dir` in bytes, if it has one.
pub fn memory_limit(dir: &Path) -> Option<u64> {
    for f in ["memory.max", "memory.limit_in_bytes"] {
        if let Ok(s) = std::fs::read_to_string(dir.join(f)) {
            let s = s.trim();
            if s == "max" {
                return None;
            }
            let v: u64 = s.parse().ok()?;
            // v1 reports "no limit" as a huge page-rounded number.
            return (v < (1u64 << 62)).then_some(v);
        }
    }
    None
}
