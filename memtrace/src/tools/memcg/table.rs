//! The table: one row per watched group.

use memtrace_common::names;

use super::Memcg;
use crate::error::Result;
use crate::output::{clock, Col, Printer, Row, Value};
use crate::process::cgroup::Version;
use crate::stacks::Traced;

impl Memcg {
    pub(super) fn table(&mut self, s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        let stalls: Vec<(u64, u64)> = s
            .read_folded(names::MEMCG_RECLAIM, false)?
            .into_iter()
            .map(|(id, v)| (id, v.ns))
            .collect();
        const COLS: [Col; 17] = [
            Col::text("time", "TIME", 8),
            Col::text("cgroup", "CGROUP", 24),
            Col::num("usage_kb", "USAGE_KB", 10),
            Col::num("limit_kb", "LIMIT_KB", 10),
            Col::text("limit_at", "LIMIT_AT", 16),
            Col::num("limit_level", "UP", 3),
            Col::num("pct", "PCT", 6),
            Col::num("anon_kb", "ANON_KB", 10),
            Col::num("file_kb", "FILE_KB", 10),
            Col::num("shmem_kb", "SHMEM_KB", 9),
            Col::num("psi_some_avg10", "PSI_SOME", 8),
            Col::num("psi_full_avg10", "PSI_FULL", 8),
            Col::num("high", "HIGH", 6),
            Col::num("max", "MAX", 6),
            Col::num("oom", "OOM", 5),
            Col::num("oom_kill", "OOMKILL", 7),
            Col::num("reclaim_stall_ms", "STALLms", 9),
        ];
        let now = clock();
        let mut rows = Vec::new();
        for w in &self.groups {
            let g = &w.group;
            let usage = g.usage().unwrap_or(0);
            let st = g.stat();
            let ev = g.events().since(&w.start);
            let psi = g.psi();
            let v2 = |n: u64| match g.version {
                Version::V2 => Value::U(n),
                Version::V1 => Value::Null,
            };
            let stall_ns: u64 = stalls
                .iter()
                .filter(|(id, _)| w.ids.contains(id))
                .map(|(_, ns)| ns)
                .sum();
            let (limit, at, up, pct) = match &w.limit {
                Some((l, at)) => (
                    Value::U(l / 1024),
                    Value::S(at.path.clone()),
                    Value::U(levels_up(&g.path, &at.path)),
                    Value::F(usage as f64 * 100.0 / *l as f64, 1),
                ),
                None => (Value::Null, Value::Null, Value::Null, Value::Null),
            };
            rows.push(Row(vec![
                now.clone().into(),
                g.path.clone().into(),
                (usage / 1024).into(),
                limit,
                at,
                up,
                pct,
                (st.anon / 1024).into(),
                (st.file / 1024).into(),
                (st.shmem / 1024).into(),
                psi.map(|p| Value::F(p.some_avg10, 2))
                    .unwrap_or(Value::Null),
                psi.map(|p| Value::F(p.full_avg10, 2))
                    .unwrap_or(Value::Null),
                v2(ev.high),
                ev.max.into(),
                v2(ev.oom),
                ev.oom_kill.into(),
                Value::F(stall_ns as f64 / 1e6, 1),
            ]));
        }
        self.rows += rows.len() as u64;
        out.table("memcg_sample", "", &COLS, &rows);
        Ok(())
    }
}

/// How many levels `ancestor` is above `path` (0: itself).
pub(super) fn levels_up(path: &str, ancestor: &str) -> u64 {
    let depth = |p: &str| p.split('/').filter(|c| !c.is_empty()).count() as u64;
    depth(path).saturating_sub(depth(ancestor))
}

#[cfg(test)]
mod tests {
    #[test]
    fn levels_up_counts_path_components() {
        assert_eq!(super::levels_up("/a/b", "/a/b"), 0);
        assert_eq!(super::levels_up("/a/b", "/a"), 1);
        assert_eq!(super::levels_up("/a/b/c", "/"), 3);
    }
}
