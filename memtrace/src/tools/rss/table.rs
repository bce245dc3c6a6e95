//! rss's table: a row per process with its counters and peak, a last
//! row for each that exited (from the kernel's exit record, or its row
//! marked when that record was lost), and a TOTAL of the live ones.

use std::collections::HashSet;

use memtrace_common::names;
use memtrace_common::rss::{RssVal, ANON, FILE, SHMEM, SWAP};

use super::{seed, Rss};
use crate::error::Result;
use crate::output::{clock, Col, Printer, Row, Value};
use crate::session::records::comm;
use crate::stacks::Traced;

impl Rss {
    pub(super) fn table(&mut self, s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        if let Some(ev) = self.over_at_start.take() {
            self.print_cross(s, out, &ev, true)?;
        }
        // A process that exited gets a last row (unless hidden) and leaves
        // the table; a new child is seeded; a stranger is never listed.
        // Names taken at exec, read before `forget` lets go of them.
        let renamed = crate::probes::follow::exec_names(s);
        // Exited since the last report (the kernel said so): a last row
        // each, under the name it had at exit; its pid followed no more.
        let mut last = std::mem::take(&mut self.exits);
        let told: HashSet<u32> = last.iter().map(|(p, _)| *p).collect();
        for p in told.iter().filter(|p| **p != self.target) {
            s.hash_remove(names::FOLLOWED, p)?;
        }
        self.forget(s, &told)?;
        let mut left = HashSet::new();
        for (pid, v) in self.read(s)? {
            let followed = s.hash_get(names::FOLLOWED, &pid).is_some();
            // Its row says it exited: its exit record was lost (counted),
            // or has not been read yet (then it is let go when it comes).
            let fate = if v.exited != 0 {
                self.ended_early.insert(pid);
                seed::Fate::Gone { reused: false }
            } else {
                // Alive under this pid: a record of an earlier process
                // under it is not waited for.
                self.ended_early.remove(&pid);
                self.born.fate(pid, self.target, followed)
            };
            match fate {
                seed::Fate::Ours => {}
                seed::Fate::New => {
                    if !self.born.seed_into(s, pid, |_| {})? {
                        // Gone before it could be seeded: a last row.
                        left.insert(pid);
                        last.push((pid, v));
                    }
                }
                seed::Fate::Gone { reused } => {
                    left.insert(pid);
                    last.push((pid, v));
                    if reused {
                        s.hash_remove(names::FOLLOWED, &pid)?;
                    }
                }
                seed::Fate::Stranger => {
                    self.unattributed += 1;
                    s.hash_remove(names::RSS, &pid)?;
                }
            }
        }
        self.forget(s, &left)?;
        let gone: HashSet<u32> = told.union(&left).copied().collect();
        let rows: Vec<(u32, RssVal)> = self
            .read(s)?
            .into_iter()
            .filter(|(p, _)| self.born.0.contains_key(p))
            .chain(last)
            .collect();
        // Those that left are counted in `exited`.
        let live = rows.iter().map(|(p, _)| *p).filter(|p| !gone.contains(p));
        self.seen.extend(live);
        // Not for those gone: the map would keep them.
        let pids: Vec<u32> = rows
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| !gone.contains(p))
            .collect();
        let excluded = self.refresh_excluded(s, &pids)?;
        let cols = [
            Col::text("time", "TIME", 8),
            Col::num("pid", "PID", 7),
            Col::text("comm", "COMM", 16),
            Col::num("rss_kb", "RSS_KB", 10),
            Col::num("anon_kb", "ANON_KB", 10),
            Col::num("file_kb", "FILE_KB", 10),
            Col::num("shmem_kb", "SHMEM_KB", 9),
            Col::num("swap_kb", "SWAP_KB", 9),
            Col::num("peak_kb", "PEAK_KB", 10),
            Col::num("counted_kb", "COUNTED_KB", 10),
            Col::text("exited", "EXITED", 6),
        ];
        let kb = |b: i64| Value::U(b.max(0) as u64 / 1024);
        let now = clock();
        let mut table: Vec<Row> = Vec::new();
        let mut sum = [0i64; 5];
        let mut live = 0;
        for (pid, v) in &rows {
            let rss = v.bytes[FILE] + v.bytes[ANON] + v.bytes[SHMEM];
            let counted = rss - excluded.get(pid).copied().unwrap_or(0) as i64;
            let exited = gone.contains(pid);
            if exited && self.args.hide_exited {
                continue;
            }
            // The name it has now, or took at its last exec: it may have
            // exec'd since its first change.
            let name = match renamed.get(pid).cloned() {
                _ if told.contains(pid) => comm(&v.comm),
                Some(n) => n,
                _ if exited => comm(&v.comm),
                None => crate::process::proc::comm(*pid).unwrap_or_else(|| comm(&v.comm)),
            };
            table.push(Row(vec![
                now.clone().into(),
                (*pid).into(),
                name.into(),
                kb(rss),
                kb(v.bytes[ANON]),
                kb(v.bytes[FILE]),
                kb(v.bytes[SHMEM]),
                kb(v.bytes[SWAP]),
                kb(v.peak as i64),
                kb(counted),
                Value::B(exited),
            ]));
            self.shown += 1;
            if exited {
                continue;
            }
            live += 1;
            for (i, x) in [
                rss,
                v.bytes[ANON],
                v.bytes[FILE],
                v.bytes[SHMEM],
                v.bytes[SWAP],
            ]
            .iter()
            .enumerate()
            {
                sum[i] += x;
            }
        }
        if live > 1 {
            table.push(Row(vec![
                now.into(),
                Value::Null,
                "TOTAL".into(),
                kb(sum[0]),
                kb(sum[1]),
                kb(sum[2]),
                kb(sum[3]),
                kb(sum[4]),
                Value::Null,
                Value::Null,
                Value::Null,
            ]));
        }
        out.table("rss", "", &cols, &table);
        Ok(())
    }
}
