//! Identical stacks of different processes as one (unless `--per-pid`):
//! three backends of one server running the same code path are one entry,
//! not three filling a `--top 3`. A printer in front of the real one, so
//! every tool's stacks are merged the same way.

use std::collections::HashMap;

use super::{Col, Hist, Printer, Rest, Row, Shown, ShownKey, StackReport, Summary};

/// Merges reports whose name and frames are equal (and pid, with
/// `per_pid`): counts and bytes add, the pid kept is the largest
/// contributor's. Largest first. Call sites that print alike (frames by
/// function) merge within a process too.
pub fn merge_stacks(stacks: &[StackReport], per_pid: bool) -> Vec<StackReport> {
    let mut out: Vec<StackReport> = Vec::new();
    let mut at: HashMap<ShownKey, usize> = HashMap::new();
    let mut top: Vec<u64> = Vec::new();
    // Distinct pids per merged stack: call sites of one process merge too.
    // Rows that count more processes than they name add the difference.
    let mut pids: Vec<std::collections::HashSet<u32>> = Vec::new();
    let mut unnamed: Vec<usize> = Vec::new();
    for s in stacks {
        let key = s.shown(if per_pid { s.pid } else { 0 });
        match at.get(&key) {
            Some(&i) => {
                let m = &mut out[i];
                if s.count > top[i] {
                    (m.pid, top[i]) = (s.pid, s.count);
                }
                // Saturating: recorded counts come from a file.
                m.count = m.count.saturating_add(s.count);
                m.bytes = match (m.bytes, s.bytes) {
                    (Some(a), Some(b)) => Some(a.saturating_add(b)),
                    (a, b) => a.or(b),
                };
                if let (Some(a), Some(b)) = (&mut m.alloc, &s.alloc) {
                    a.add(b);
                }
                if m.group != s.group {
                    m.group = None;
                }
                pids[i].insert(s.pid);
                pids[i].extend(&s.pids);
                unnamed[i] += s.processes.saturating_sub(1 + s.pids.len());
                m.processes = pids[i].len() + unnamed[i];
            }
            None => {
                at.insert(key, out.len());
                top.push(s.count);
                let mut set: std::collections::HashSet<u32> = [s.pid].into();
                set.extend(&s.pids);
                unnamed.push(s.processes.saturating_sub(1 + s.pids.len()));
                let mut m = s.clone();
                m.processes = s.processes.max(set.len());
                pids.push(set);
                out.push(m);
            }
        }
    }
    if out.iter().all(|s| s.alloc.is_some_and(|a| a.by_bytes)) {
        out.sort_by_key(|s| std::cmp::Reverse(s.bytes));
    } else {
        out.sort_by_key(|s| std::cmp::Reverse(s.count));
    }
    out
}

/// A printer that merges stacks before the one it wraps prints them, then
/// keeps the tool's `--top` of them and says what the others add up to; the
/// flag keeps processes apart (`--per-pid`). Tools hand over every stack:
/// a stack that many processes share ranks by its sum.
pub struct MergedStacks(pub Box<dyn Printer>, pub bool, pub Option<usize>);

impl Printer for MergedStacks {
    fn event(&mut self, kind: &'static str, cols: &[Col], row: &Row) {
        self.0.event(kind, cols, row)
    }
    fn event_stack(&mut self, kind: &'static str, cols: &[Col], row: &Row, stack: &[Shown]) {
        self.0.event_stack(kind, cols, row, stack)
    }
    fn table(&mut self, kind: &'static str, title: &str, cols: &[Col], rows: &[Row]) {
        self.0.table(kind, title, cols, rows)
    }
    fn stacks(&mut self, kind: &'static str, title: &str, stacks: &[StackReport]) {
        let mut m = merge_stacks(stacks, self.1);
        let top = self.2.unwrap_or(usize::MAX);
        let rest = (m.len() > top).then(|| Rest::of_stacks(&m[top..]));
        m.truncate(top);
        self.0.stacks(kind, title, &m);
        if let Some(r) = rest {
            self.0.rest(kind, &r);
        }
    }
    fn rest(&mut self, kind: &'static str, rest: &Rest) {
        self.0.rest(kind, rest)
    }
    fn histogram(&mut self, h: &Hist) {
        self.0.histogram(h)
    }
    fn summary(&mut self, s: &Summary) {
        self.0.summary(s)
    }
    fn flush(&mut self) {
        self.0.flush()
    }
    fn error(&self) -> Option<&std::io::Error> {
        self.0.error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(pid: u32, count: u64, user: &[&str]) -> StackReport {
        StackReport {
            pid,
            comm: "postgres".into(),
            count,
            bytes: Some(count * 10),
            user: user.iter().map(|s| Shown::from(*s)).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn identical_stacks_of_several_processes_become_one() {
        let all = [
            r(
                1,
                5,
                &["memset [libc.so.6]", "exec_simple_query [postgres]"],
            ),
            r(
                2,
                7,
                &["memset [libc.so.6]", "exec_simple_query [postgres]"],
            ),
            r(3, 9, &["palloc [postgres]"]),
            // Another call site of process 3, the same by function.
            r(3, 2, &["palloc [postgres]"]),
            r(
                4,
                1,
                &["memset [libc.so.6]", "exec_simple_query [postgres]"],
            ),
        ];
        let m = merge_stacks(&all, false);
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m[0].count, m[0].bytes, m[0].processes, m[0].pid),
            (13, Some(130), 3, 2)
        );
        assert_eq!((m[1].count, m[1].processes, m[1].pid), (11, 1, 3));
        let apart = merge_stacks(&all, true);
        let counts: Vec<u64> = apart.iter().map(|s| s.count).collect();
        assert_eq!(counts, [11, 7, 5, 1]);
    }

    #[test]
    fn sums_near_the_top_of_u64_saturate_instead_of_wrapping() {
        let mut big = r(1, u64::MAX - 1, &["palloc [postgres]"]);
        big.bytes = Some(u64::MAX - 1);
        let m = merge_stacks(&[big, r(2, 5, &["palloc [postgres]"])], false);
        assert_eq!((m[0].count, m[0].bytes), (u64::MAX, Some(u64::MAX)));
    }
}
