//! The report of a threshold crossing: the counters, the allocating stack
//! and the largest mappings, at the moment it was seen.

use memtrace_common::rss::{RssCross, ANON, FILE, SHMEM};

use super::Rss;
use crate::error::Result;
use crate::output::{clock, Col, Printer, Row, Value};
use crate::run::tool::Tool;
use crate::session::records::comm;
use crate::stacks::Traced;

impl Rss {
    /// One threshold crossing: the counters, the allocating stack and the
    /// largest mappings.
    pub(super) fn print_cross(
        &mut self,
        s: &mut Traced,
        out: &mut dyn Printer,
        ev: &RssCross,
        at_start: bool,
    ) -> Result<()> {
        self.crossed = true;
        self.shown += 1;
        let rss = ev.bytes[FILE] + ev.bytes[ANON] + ev.bytes[SHMEM];
        let cols = [
            Col::text("time", "TIME", 8),
            Col::num("pid", "PID", 7),
            Col::text("comm", "COMM", 16),
            Col::num("threshold_kb", "THRESH_KB", 10),
            Col::num("rss_kb", "RSS_KB", 10),
            Col::num("anon_kb", "ANON_KB", 10),
            Col::num("file_kb", "FILE_KB", 10),
            Col::num("shmem_kb", "SHMEM_KB", 9),
            Col::num("excluded_kb", "EXCL_KB", 9),
            Col::num("task_pid", "BY_PID", 7),
            Col::text("task_comm", "BY_COMM", 16),
        ];
        let kb = |b: i64| Value::U(b.max(0) as u64 / 1024);
        let row = Row(vec![
            clock().into(),
            ev.pid.into(),
            comm(&ev.comm).into(),
            Value::U(self.args.threshold.unwrap_or(0) / 1024),
            kb(rss),
            kb(ev.bytes[ANON]),
            kb(ev.bytes[FILE]),
            kb(ev.bytes[SHMEM]),
            Value::U(ev.excluded / 1024),
            ev.task_pid.into(),
            comm(&ev.task_comm).into(),
        ]);
        out.event("rss_threshold", &cols, &row);
        let mut stack = crate::stacks::ustack::stack_report(
            s,
            ev.task_pid,
            comm(&ev.task_comm),
            (ev.ustack, 0, ev.kstack),
            self.stack_mode(),
            1,
            None,
        );
        if at_start {
            stack.note = Some("over the threshold already when tracing started".into());
        }
        out.stacks("rss_threshold_stack", "", &[stack]);
        // pmap-like: the largest mappings by RSS, at the moment it was seen.
        crate::process::pmap::largest_mappings(out, "rss_mapping", ev.pid, 10);
        Ok(())
    }
}
