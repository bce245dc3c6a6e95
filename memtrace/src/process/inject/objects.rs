//! The files a process maps, as the injection needs them: where each is
//! loaded (its bias and range) and what it exports.

use std::collections::HashMap;
use std::path::PathBuf;

use super::got;

/// A file mapped in `pid` and its load bias.
pub(super) struct Loaded {
    pub shown: String,
    pub host: PathBuf,
    pub bias: u64,
    /// Its `(dev, inode)` as fstat gives them.
    pub id: (u64, u64),
    /// Its mapped range, lowest to highest address.
    pub span: (u64, u64),
}

pub(super) fn loaded(pid: u32) -> Vec<Loaded> {
    let maps = crate::process::maps::read_maps(pid).unwrap_or_default();
    let page = crate::kernel::btf::page_size();
    let mut out: Vec<Loaded> = Vec::new();
    // Only files with code: a database's data files are mapped too, and
    // are read whole here while the process is held.
    let code: std::collections::HashSet<&str> = maps
        .iter()
        .filter(|m| m.perms.contains('x'))
        .map(|m| &*m.path)
        .collect();
    for m in &maps {
        if !m.path.starts_with('/')
            || !code.contains(&*m.path)
            || out.iter().any(|l| *l.shown == *m.path)
        {
            continue;
        }
        let Ok(host) = m.open_in(pid).and_then(crate::process::maps::pinned) else {
            continue;
        };
        let Ok(first) = crate::process::maps::read_object(&host)
            .map_err(drop)
            .and_then(|d| got::first_load(&d).ok_or(()))
        else {
            continue;
        };
        let same = |x: &&crate::process::maps::Mapping| x.path == m.path;
        let Some(base) = maps
            .iter()
            .filter(same)
            .find(|x| x.offset == first.1 & !(page - 1))
        else {
            continue;
        };
        let hi = maps
            .iter()
            .filter(same)
            .map(|x| x.end)
            .max()
            .unwrap_or(base.end);
        out.push(Loaded {
            shown: m.path.to_string(),
            host,
            id: (libc::makedev(m.dev.0, m.dev.1), m.inode),
            bias: got::bias(base.start, first, page),
            span: (base.start, hi),
        });
    }
    out
}

pub(super) fn file_name(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// The exported functions of a loaded object, as addresses in the process
/// (the file read and parsed once).
pub(super) fn functions(l: &Loaded) -> HashMap<String, u64> {
    let data = crate::process::maps::read_object(&l.host).unwrap_or_default();
    got::exports(&data)
        .map(|e| e.into_iter().map(|(n, a)| (n, l.bias + a)).collect())
        .unwrap_or_default()
}
