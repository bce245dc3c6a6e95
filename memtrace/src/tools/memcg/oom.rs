//! An OOM kill in a watched group: the victim, and the group's usage and
//! pressure over the run-up to it.

use std::time::Instant;

use memtrace_common::{kind, names, oom::OomEvent};

use super::Memcg;
use crate::error::Result;
use crate::output::{clock, Col, Printer, Row, Value};
use crate::session::records::{comm, record};
use crate::stacks::Traced;

impl Memcg {
    pub(super) fn on_oom(
        &mut self,
        data: &[u8],
        s: &mut Traced,
        out: &mut dyn Printer,
    ) -> Result<()> {
        let Some(ev) = record::<OomEvent>(data, kind::OOM) else {
            return Ok(());
        };
        // The victim's group is one watched or below one. By kprobe or
        // fentry the group is the OOM's, the one that sets the limit: then
        // the victim must have been seen in a watched group.
        let seen = |w: &super::Watched| {
            s.hash_get(names::MEMCG_PROCS, &ev.victim_pid)
                .is_some_and(|p| w.ids.contains(&p.memcg_id))
                || crate::process::cgroup::resolve(&ev.victim_pid.to_string())
                    .is_ok_and(|g| w.ids.contains(&g.charged_to().id()))
        };
        let Some(w) = self.groups.iter().find(|w| {
            w.ids.contains(&ev.memcg_id)
                || (w
                    .limit
                    .as_ref()
                    .is_some_and(|(_, at)| at.id() == ev.memcg_id)
                    && seen(w))
        }) else {
            return Ok(());
        };
        self.kills += 1;
        let mut victim = comm(&ev.victim_comm);
        if victim.is_empty() {
            victim = crate::process::proc::comm(ev.victim_pid).unwrap_or_default();
        }
        let where_ = crate::kernel::cgroupid::path_of(ev.memcg_id).map(|(_, p)| p);
        // The group's other processes, for what they hold.
        let others: std::collections::HashSet<u32> = match self.heap.is_some() {
            true => w
                .group
                .with_descendants()
                .iter()
                .flat_map(|g| g.procs())
                .filter(|&p| p != ev.victim_pid)
                .collect(),
            false => Default::default(),
        };
        let limit = w.limit.as_ref().map(|(l, _)| *l);
        let cols = [
            Col::text("time", "TIME", 8),
            Col::text("cgroup", "CGROUP", 24),
            Col::num("victim_pid", "VPID", 7),
            Col::text("victim_comm", "VCOMM", 15),
            Col::text("memcg", "MEMCG", 24),
            Col::num("anon_rss_kb", "ANON_KB", 9),
            Col::num("file_rss_kb", "FILE_KB", 8),
            Col::num("shmem_rss_kb", "SHMEM_KB", 8),
            Col::num("trigger_pid", "TPID", 7),
            Col::num("limit_kb", "LIMIT_KB", 10),
            Col::text("limit_at", "LIMIT_AT", 16),
        ];
        let row = Row(vec![
            clock().into(),
            w.group.path.clone().into(),
            ev.victim_pid.into(),
            victim.into(),
            where_.into(),
            ev.anon_rss_kb.into(),
            ev.file_rss_kb.into(),
            ev.shmem_rss_kb.into(),
            ev.trigger_pid.into(),
            limit.map(|l| l / 1024).into(),
            w.limit.as_ref().map(|(_, at)| at.path.clone()).into(),
        ]);
        out.table(
            "memcg_oom",
            "OOM kill in a watched memory cgroup",
            &cols,
            &[row],
        );
        // The run-up: the samples of the last 30 s, oldest first.
        let now = Instant::now();
        let tcols = [
            Col::num("seconds_before", "SECS", 6),
            Col::num("usage_kb", "USAGE_KB", 10),
            Col::num("pct", "PCT", 6),
            Col::num("psi_some_avg10", "PSI_SOME", 8),
            Col::num("psi_full_avg10", "PSI_FULL", 8),
            Col::text("by", "BY", 12),
        ];
        let rows: Vec<Row> = w
            .timeline
            .iter()
            .map(|x| {
                Row(vec![
                    Value::F(-(now - x.at).as_secs_f64(), 1),
                    (x.usage / 1024).into(),
                    limit.map_or(Value::Null, |l| {
                        Value::F(x.usage as f64 * 100.0 / l as f64, 1)
                    }),
                    x.psi.map_or(Value::Null, |p| Value::F(p.some_avg10, 2)),
                    x.psi.map_or(Value::Null, |p| Value::F(p.full_avg10, 2)),
                    match x.step {
                        Some(p) => format!("crossed {p}%").into(),
                        None => "sample".into(),
                    },
                ])
            })
            .collect();
        out.table("memcg_oom_timeline", "Usage before the kill", &tcols, &rows);
        let title = format!(
            "Heap held by the victim, PID {} ({}), at the kill, by stack",
            ev.victim_pid,
            comm(&ev.victim_comm)
        );
        self.heap_of(&[ev.victim_pid].into(), "memcg_oom_heap", &title, s, out)?;
        // The victim is not always what filled the group.
        let biggest = self.biggest_of(&others, s)?;
        if !biggest.is_empty() {
            let title = "Heap held by the group's other biggest holders at the kill, by stack";
            self.heap_of(&biggest, "memcg_oom_group_heap", title, s, out)?;
        }
        Ok(())
    }
}
