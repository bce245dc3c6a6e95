//! Identical stacks of different processes as one (unless `--per-pid`):
//! three backends of one server running the same code path are one entry,
//! not three filling a `--top 3`. A printer in front of the real one, so
//! every tool's stacks are merged the same way.

use std::collections::{HashMap, HashSet};

use super::{Col, Hist, Printer, Rest, Row, Shown, StackReport, Summary};

/// Merges reports whose name and frames are equal (and pid, with
/// `per_pid`): counts and bytes add, the pid kept is the largest
/// contributor's. Largest first. Call sites that print alike (frames by
/// function) merge within a process too.
pub fn merge_stacks(stacks: &[StackReport], per_pid: bool) -> Vec<StackReport> {
    let mut m = Merger::new(per_pid);
    for s in stacks {
        m.push(s.clone());
    }
    m.finish()
}

/// `merge_stacks` as the reports are made: a tool that turns tens of
/// thousands of per-process counts into reports merges each as it comes,
/// rather than holding them all and a merged copy (most of `faults
/// --stacks`' peak at its report under a churn).
pub struct Merger {
    per_pid: bool,
    out: Vec<StackReport>,
    /// Rows by the hash of what they show (`ShownKey`, which borrows from
    /// the row): the candidates are compared whole.
    at: HashMap<u64, Vec<usize>>,
    /// The count of the largest contributor of each, whose pid it keeps.
    top: Vec<u64>,
    /// Distinct pids per merged stack: call sites of one process merge too.
    pids: Vec<HashSet<u32>>,
    /// Processes rows counted beyond those they name.
    unnamed: Vec<usize>,
    hasher: std::collections::hash_map::RandomState,
}

impl Merger {
    pub fn new(per_pid: bool) -> Self {
        Merger {
            per_pid,
            out: Vec::new(),
            at: HashMap::new(),
            top: Vec::new(),
            pids: Vec::new(),
            unnamed: Vec::new(),
            hasher: Default::default(),
        }
    }

    pub fn push(&mut self, s: StackReport) {
        let pid = |r: &StackReport| if self.per_pid { r.pid } else { 0 };
        let key = s.shown(pid(&s));
        let h = std::hash::BuildHasher::hash_one(&self.hasher, key);
        let found = self.at.get(&h).and_then(|c| {
            c.iter()
                .copied()
                .find(|&i| self.out[i].shown(pid(&self.out[i])) == key)
        });
        let Some(i) = found else {
            self.at.entry(h).or_default().push(self.out.len());
            self.top.push(s.count);
            let mut set: HashSet<u32> = [s.pid].into();
            set.extend(&s.pids);
            self.unnamed
                .push(s.processes.saturating_sub(1 + s.pids.len()));
            let mut m = s;
            m.processes = m.processes.max(set.len());
            self.pids.push(set);
            self.out.push(m);
            return;
        };
        let m = &mut self.out[i];
        if s.count > self.top[i] {
            (m.pid, self.top[i]) = (s.pid, s.count);
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
        self.pids[i].insert(s.pid);
        self.pids[i].extend(&s.pids);
        self.unnamed[i] += s.processes.saturating_sub(1 + s.pids.len());
        m.processes = self.pids[i].len() + self.unnamed[i];
    }

    /// The merged reports, largest first.
    pub fn finish(self) -> Vec<StackReport> {
        let mut out = self.out;
        if out.iter().all(|s| s.alloc.is_some_and(|a| a.by_bytes)) {
            out.sort_by_key(|s| std::cmp::Reverse(s.bytes));
        } else {
            out.sort_by_key(|s| std::cmp::Reverse(s.count));
        }
        out
    }
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

    /// A tool merges as it makes its reports, and the printer merges what
    /// it is handed again: the second merge changes nothing, processes
    /// included.
    #[test]
    fn rows_merged_as_they_come_merge_again_unchanged() {
        let mut m = Merger::new(false);
        for pid in 1..=5 {
            m.push(r(pid, pid as u64, &["touch [w]", "main [w]"]));
        }
        m.push(r(9, 4, &["sbrk [libc.so.6]"]));
        let once = m.finish();
        assert_eq!(once.len(), 2);
        assert_eq!((once[0].count, once[0].processes, once[0].pid), (15, 5, 5));
        let twice = merge_stacks(&once, false);
        let key = |v: &[StackReport]| {
            v.iter()
                .map(|s| (s.count, s.bytes, s.processes, s.pid, s.user.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(key(&twice), key(&once));
    }

    #[test]
    fn sums_near_the_top_of_u64_saturate_instead_of_wrapping() {
        let mut big = r(1, u64::MAX - 1, &["palloc [postgres]"]);
        big.bytes = Some(u64::MAX - 1);
        let m = merge_stacks(&[big, r(2, 5, &["palloc [postgres]"])], false);
        assert_eq!((m[0].count, m[0].bytes), (u64::MAX, Some(u64::MAX)));
    }
}
