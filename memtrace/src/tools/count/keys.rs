//! What `count --by` keys by, and each key's cells: the kernel counts by
//! process, thread, name, group and fields; a group's container or pod is
//! read from its path here, the groups that name the same one added up.

use std::collections::HashMap;

use memtrace_common::generic::{CountKey, CountVal};

use crate::kernel::cgroupid;
use crate::output::Value;
use crate::process::container;
use crate::session::records::comm;

/// A key column: what `--by` named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyCol {
    Pid,
    Tid,
    Comm,
    Cgroup,
    /// The container or pod a group path names (its groups' counts added).
    Container,
    Pod,
    Field(usize, &'static str),
}

/// Group paths by kernfs id, for one report: finding one walks the
/// hierarchy, and many keys share a group.
type Paths = HashMap<u64, Option<String>>;

/// The key's cells, as the columns show them.
fn cells(cols: &[KeyCol], k: &CountKey, paths: &mut Paths) -> Vec<Value> {
    let grouped = cols
        .iter()
        .any(|c| matches!(c, KeyCol::Cgroup | KeyCol::Container | KeyCol::Pod));
    let path = match grouped {
        true => paths
            .entry(k.cgroup)
            .or_insert_with(|| cgroupid::path_of(k.cgroup).map(|(_, p)| p))
            .clone(),
        false => None,
    };
    let found = path.as_deref().and_then(container::of_cgroup);
    cols.iter()
        .map(|c| match *c {
            KeyCol::Pid => k.tgid.into(),
            KeyCol::Tid => k.tid.into(),
            KeyCol::Comm => comm(&k.comm).into(),
            KeyCol::Cgroup => path.clone().unwrap_or_else(|| k.cgroup.to_string()).into(),
            // As `docker ps` shortens it; "-" outside any container.
            KeyCol::Container => found
                .as_ref()
                .map_or("-".into(), |c| c.id.chars().take(12).collect::<String>())
                .into(),
            KeyCol::Pod => found
                .as_ref()
                .and_then(|c| c.pod_uid.clone())
                .unwrap_or_else(|| "-".into())
                .into(),
            KeyCol::Field(i, _) => k.fields[i].into(),
        })
        .collect()
}

/// Tracepoint `index`'s rows, largest first: keys that show alike
/// (groups of one container or pod) are one row.
pub(super) fn rows_of(
    cols: &[KeyCol],
    index: u32,
    v: &[&(CountKey, CountVal)],
) -> Vec<(Vec<Value>, u64, u64)> {
    let mut out: Vec<(Vec<Value>, u64, u64)> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    let mut paths = Paths::new();
    for (k, val) in v.iter().filter(|(k, _)| k.index == index) {
        let cells = cells(cols, k, &mut paths);
        let id = format!("{cells:?}");
        match at.get(&id) {
            Some(&i) => {
                out[i].1 += val.count;
                out[i].2 = out[i].2.wrapping_add(val.sum);
            }
            None => {
                at.insert(id, out.len());
                out.push((cells, val.count, val.sum));
            }
        }
    }
    out.sort_by_key(|r| std::cmp::Reverse(r.1));
    out
}
