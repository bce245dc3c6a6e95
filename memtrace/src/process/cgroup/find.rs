//! Which memory cgroups there are, and which one a path or a process names.

use std::path::{Path, PathBuf};

use super::{proc_cgroup_paths, Group, Version};
use crate::error::{Error, Result};
use crate::kernel::cgroupid::memory_roots;

/// The memory hierarchies mounted here: v1's memory controller, and v2's
/// where it has the memory controller.
pub fn hierarchies() -> Vec<(PathBuf, Version)> {
    memory_roots()
        .into_iter()
        .filter_map(|r| {
            if r.join("memory.usage_in_bytes").exists() {
                Some((r, Version::V1))
            } else {
                let c = std::fs::read_to_string(r.join("cgroup.controllers")).ok()?;
                c.split_whitespace()
                    .any(|w| w == "memory")
                    .then_some((r, Version::V2))
            }
        })
        .collect()
}

/// Every memory cgroup with a limit of its own.
pub fn limited_groups() -> Vec<Group> {
    let mut out = Vec::new();
    for (root, version) in hierarchies() {
        let top = Group::in_hierarchy(root, "/".into(), version);
        out.extend(
            top.with_descendants()
                .into_iter()
                .filter(|g| g.limit().is_some()),
        );
    }
    out
}

/// The group `arg` names: a process id, a directory (absolute), or a path
/// inside a memory hierarchy ("/a/b").
pub fn resolve(arg: &str) -> Result<Group> {
    let hier = hierarchies();
    if hier.is_empty() {
        return Err(Error::Usage("no memory cgroup hierarchy is mounted".into()));
    }
    if let Ok(pid) = arg.parse::<u32>() {
        let text = std::fs::read(format!("/proc/{pid}/cgroup"))
            .map_err(|e| Error::Usage(format!("process {pid}: {e}")))?;
        let (v1, v2) = proc_cgroup_paths(&text);
        for (root, version) in &hier {
            let path = match version {
                Version::V1 => v1.clone(),
                Version::V2 => v2.clone(),
            };
            if let Some(path) = path {
                return Ok(Group::in_hierarchy(root.clone(), path, *version));
            }
        }
        return Err(Error::Usage(format!(
            "process {pid} is in no memory cgroup"
        )));
    }
    let p = Path::new(arg);
    for (root, version) in &hier {
        let rel = match p.strip_prefix(root) {
            Ok(r) => r.to_path_buf(),
            Err(_) if root.join(arg.trim_start_matches('/')).is_dir() => {
                PathBuf::from(arg.trim_start_matches('/'))
            }
            Err(_) => continue,
        };
        let g = Group::in_hierarchy(root.clone(), rel.into_os_string(), *version);
        if g.dir().is_dir() {
            return Ok(g);
        }
    }
    Err(Error::Usage(format!(
        "'{arg}' is not a memory cgroup (nor a process id)"
    )))
}
