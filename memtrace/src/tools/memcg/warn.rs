//! The warning at a crossing: the group, its usage and limit, and the
//! processes in it that grew most, each with the stack of its latest growth.

use std::time::Instant;

use memtrace_common::{memcg::MemcgCross, names};

use super::{rss, Memcg};
use crate::error::Result;
use crate::output::{clock, Col, Printer, Row, Value};
use crate::run::tool::Tool;
use crate::session::records::comm;
use crate::stacks::Traced;

/// Processes listed (and stacks printed) per warning.
const TOP: usize = 5;

impl Memcg {
    /// Group `i`'s usage now, when it is at or over the warning line.
    pub(super) fn over_line(&self, i: usize) -> Option<u64> {
        let w = &self.groups[i];
        let thr = w.threshold(self.args.warn?)?;
        let usage = w.limit.as_ref().and_then(|(_, at)| at.usage())?;
        (usage >= thr).then_some(usage)
    }

    /// Warns if group `i` is at or over the `--warn` line (the notifiers
    /// also fire on the way down).
    pub(super) fn check_usage(
        &mut self,
        i: usize,
        why: &str,
        s: &mut Traced,
        out: &mut dyn Printer,
    ) -> Result<()> {
        // The usage that was over the line, not a later read.
        if let Some(usage) = self.over_line(i) {
            self.warn(i, why, Some(usage), s, out)?;
        }
        Ok(())
    }

    /// The kernel saw an allocation take the group that sets a limit over
    /// the line: every watched group under that limit with the allocating
    /// task in it is warned about.
    pub(super) fn on_cross(
        &mut self,
        ev: &MemcgCross,
        s: &mut Traced,
        out: &mut dyn Printer,
    ) -> Result<()> {
        for i in 0..self.groups.len() {
            let w = &self.groups[i];
            let under = w
                .limit
                .as_ref()
                .is_some_and(|(_, at)| at.id() == ev.limit_id);
            if under && w.ids.contains(&ev.task_id) {
                let usage = ev.usage_pages * crate::kernel::btf::page_size();
                self.warn(i, "allocation", Some(usage), s, out)?;
            }
        }
        Ok(())
    }

    /// One warning per group.
    pub(super) fn warn(
        &mut self,
        i: usize,
        why: &str,
        usage: Option<u64>,
        s: &mut Traced,
        out: &mut dyn Printer,
    ) -> Result<()> {
        if self.groups[i].warned {
            return Ok(());
        }
        self.groups[i].warned = true;
        self.warnings += 1;
        self.describe(
            i,
            why,
            usage,
            "WARNING: memory cgroup near its limit",
            s,
            out,
        )
    }

    /// systemd-oomd is about to kill groups: each one watched (or under a
    /// watched one) is described, and oomd answered after.
    pub(super) fn on_prekill(&mut self, s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        let calls = self.hook.as_ref().map(|h| h.calls()).unwrap_or_default();
        for (conn, call) in calls {
            if let super::prekill::Call::Notify(g) = &call {
                self.prekills += 1;
                let inside = |w: &super::Watched| {
                    let p = w.group.path.trim_end_matches('/');
                    g == &w.group.path || g.starts_with(&format!("{p}/"))
                };
                match self.groups.iter().position(inside) {
                    Some(i) => {
                        let title = format!("PREKILL: systemd-oomd is about to kill {g}");
                        self.describe(i, "prekill", None, &title, s, out)?;
                        out.flush();
                    }
                    None => say!(
                        "memtrace: systemd-oomd is about to kill {g}, which memcg does not watch (--cgroup)"
                    ),
                }
            }
            super::prekill::reply(conn, &call);
        }
        Ok(())
    }

    /// The group's usage against its limit, and the processes in it that
    /// grew most with the stacks of their latest growth.
    fn describe(
        &mut self,
        i: usize,
        why: &str,
        usage: Option<u64>,
        title: &str,
        s: &mut Traced,
        out: &mut dyn Printer,
    ) -> Result<()> {
        let w = &self.groups[i];
        let usage_at = w
            .limit
            .as_ref()
            .map_or(w.group.clone(), |(_, at)| at.clone());
        let usage = usage.or_else(|| usage_at.usage()).unwrap_or(0);
        let psi = w.group.psi();
        let limit = w.limit.as_ref().map(|(l, _)| *l);
        let (rate, left) = time_left(&w.timeline, usage, limit, Instant::now());
        // Who grew most over the window, among the group's processes.
        let now = Instant::now();
        let mut procs: Vec<(u32, u64, u64, memtrace_common::memcg::MemcgProc)> = s
            .hash_entries(names::MEMCG_PROCS)
            .into_iter()
            .filter(|(_, v)| w.ids.contains(&v.memcg_id))
            .map(|(pid, v)| {
                let now_rss = rss(&v);
                let before = self
                    .rss_history
                    .get(&pid)
                    .and_then(|h| h.front())
                    .filter(|(at, _)| now.duration_since(*at) <= super::GROWTH_WINDOW)
                    .map_or(0, |(_, b)| *b);
                (pid, now_rss, now_rss.saturating_sub(before), v)
            })
            .collect();
        procs.sort_by_key(|p| std::cmp::Reverse(p.2));
        procs.truncate(TOP);
        let pids: Vec<String> = procs.iter().map(|p| p.0.to_string()).collect();
        let cols = [
            Col::text("time", "TIME", 8),
            Col::text("cgroup", "CGROUP", 24),
            Col::text("trigger", "BY", 13),
            Col::num("usage_kb", "USAGE_KB", 10),
            Col::num("limit_kb", "LIMIT_KB", 10),
            Col::text("limit_at", "LIMIT_AT", 16),
            Col::num("pct", "PCT", 6),
            Col::num("warn_pct", "WARN", 5),
            Col::num("psi_some_avg10", "PSI_SOME", 8),
            Col::num("grow_kb_s", "KB/S", 8),
            Col::num("left_s", "LEFT_S", 6),
            Col::text("pids", "GREW_MOST", 20),
        ];
        let row = Row(vec![
            clock().into(),
            w.group.path.clone().into(),
            why.into(),
            (usage / 1024).into(),
            limit.map(|l| l / 1024).into(),
            w.limit.as_ref().map(|(_, at)| at.path.clone()).into(),
            limit.map_or(Value::Null, |l| {
                Value::F(usage as f64 * 100.0 / l as f64, 1)
            }),
            self.args.warn.map_or(Value::Null, |p| Value::F(p, 1)),
            psi.map_or(Value::Null, |p| Value::F(p.some_avg10, 2)),
            rate.map(|r| (r / 1024.0) as u64).into(),
            left.map_or(Value::Null, |s| Value::F(s, 1)),
            pids.join(",").into(),
        ]);
        out.table("memcg_warn", title, &cols, &[row]);
        let pcols = [
            Col::num("pid", "PID", 7),
            Col::text("comm", "COMM", 16),
            Col::num("rss_kb", "RSS_KB", 10),
            Col::num("grew_kb", "GREW_KB", 10),
        ];
        let rows: Vec<Row> = procs
            .iter()
            .map(|(pid, now_rss, grew, v)| {
                Row(vec![
                    (*pid).into(),
                    comm(&v.comm).into(),
                    (now_rss / 1024).into(),
                    (grew / 1024).into(),
                ])
            })
            .collect();
        out.table("memcg_warn_process", "Grew most", &pcols, &rows);
        let mode = self.stack_mode();
        let stacks: Vec<_> = procs
            .iter()
            .filter(|p| p.2 > 0)
            .map(|(pid, _, grew, v)| {
                crate::stacks::ustack::stack_report(
                    s,
                    *pid,
                    comm(&v.comm),
                    (v.ustack, 0, v.kstack),
                    mode,
                    1,
                    Some(*grew),
                )
            })
            .collect();
        out.stacks("memcg_warn_stack", "Latest growth", &stacks);
        let grew: std::collections::HashSet<u32> = procs.iter().map(|p| p.0).collect();
        let title = "Heap held by the processes that grew most, by stack";
        self.heap_of(&grew, "memcg_warn_heap", title, s, out)?;
        Ok(())
    }
}

/// The group's growth rate (bytes a second) since the newest sample at
/// least MIN_SPAN old and below `usage`, and the seconds left at that rate
/// until `limit` (0 at or over it).
fn time_left(
    timeline: &std::collections::VecDeque<super::Sample>,
    usage: u64,
    limit: Option<u64>,
    now: Instant,
) -> (Option<f64>, Option<f64>) {
    const MIN_SPAN: std::time::Duration = std::time::Duration::from_millis(100);
    let rate = timeline
        .iter()
        .rev()
        .filter(|x| now.duration_since(x.at) >= MIN_SPAN)
        .take_while(|x| now.duration_since(x.at) <= super::GROWTH_WINDOW)
        .find(|x| x.usage < usage)
        .map(|x| (usage - x.usage) as f64 / now.duration_since(x.at).as_secs_f64());
    let left = match (limit, rate) {
        (Some(l), _) if usage >= l => Some(0.0),
        (Some(l), Some(r)) if r > 0.0 => Some((l - usage) as f64 / r),
        _ => None,
    };
    (rate, left)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn time_left_is_what_remains_at_the_latest_rate() {
        let now = Instant::now();
        let s = |ago_ms: u64, mib: u64| super::super::Sample {
            at: now - Duration::from_millis(ago_ms),
            usage: mib << 20,
            psi: None,
            step: None,
        };
        // 40 MiB 400 ms ago, 96 MiB now: 140 MiB/s, 32 MiB left of 128.
        let tl: std::collections::VecDeque<_> = [s(900, 0), s(400, 40), s(50, 95)].into();
        let (rate, left) = time_left(&tl, 96 << 20, Some(128 << 20), now);
        assert!(
            (rate.unwrap() / (1 << 20) as f64 - 140.0).abs() < 0.5,
            "{rate:?}"
        );
        assert!((left.unwrap() - 32.0 / 140.0).abs() < 0.01, "{left:?}");
        // No growth seen: no estimate; over the limit: none left.
        assert_eq!(time_left(&tl, 0, Some(1), now), (None, None));
        assert_eq!(time_left(&tl, 2 << 30, Some(1 << 30), now).1, Some(0.0));
    }
}
