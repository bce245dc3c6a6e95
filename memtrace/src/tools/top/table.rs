//! The table both faces of `top` show: its columns, sort keys, filter and
//! rows, taken from the snapshot.

use super::narrow::Scale;
use crate::output::{Col, Row, Value};
use crate::probes::snapshot::{Proc, Snapshot};

/// What rows are sorted by; the key that selects each is shown on screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SortKey {
    Pid,
    Name,
    Anon,
    File,
    Shmem,
    Faults,
    Kfaults,
    Ffaults,
    Brk,
    Mmap,
    Reclaim,
}

impl SortKey {
    /// (key, sort key, label), in the order the help line shows them.
    pub const KEYS: [(char, SortKey, &'static str); 11] = [
        ('p', SortKey::Pid, "pid"),
        ('n', SortKey::Name, "name"),
        ('a', SortKey::Anon, "anon"),
        ('l', SortKey::File, "file"),
        ('s', SortKey::Shmem, "shmem"),
        ('f', SortKey::Faults, "faults"),
        ('k', SortKey::Kfaults, "kfaults"),
        ('F', SortKey::Ffaults, "ffaults"),
        ('b', SortKey::Brk, "brk"),
        ('m', SortKey::Mmap, "mmap"),
        ('r', SortKey::Reclaim, "reclaim"),
    ];

    pub fn from_key(c: char) -> Option<SortKey> {
        Self::KEYS.iter().find(|k| k.0 == c).map(|k| k.1)
    }

    pub fn label(self) -> &'static str {
        Self::KEYS.iter().find(|k| k.1 == self).map_or("", |k| k.2)
    }
}

pub const COLS: [Col; 17] = [
    Col::num("pid", "PID", 7),
    Col::text("comm", "COMM", 15),
    Col::num("rss_anon_kb", "ANON_KB", 9),
    Col::num("rss_file_kb", "FILE_KB", 9),
    Col::num("rss_shmem_kb", "SHMEM_KB", 8),
    Col::num("rss_kb_s", "RSS_KB/s", 9),
    Col::num("faults_user_s", "FLT/s", 9),
    Col::num("faults_kernel_s", "KFLT/s", 8),
    Col::num("file_faults_s", "FFLT/s", 8),
    Col::num("brk_s", "BRK/s", 8),
    Col::num("brk_kb_s", "BRK_KB/s", 9),
    Col::num("mmap_s", "MMAP/s", 8),
    Col::num("mmap_kb_s", "MMAP_KB/s", 9),
    Col::num("reclaim_ms_s", "RECLms/s", 8),
    Col::num("oom_score", "OOM", 4),
    Col::text("container", "CONTAINER", 9),
    Col::text("cgroup", "CGROUP", 6),
];

/// Each column's units and header when its numbers are shortened (`206M`
/// in a column of kibibytes is 206 MiB, so the header loses its `_KB`).
pub const SHORT: [(Scale, &str); 17] = [
    (Scale::Whole, "PID"),
    (Scale::Whole, "COMM"),
    (Scale::Kib, "ANON"),
    (Scale::Kib, "FILE"),
    (Scale::Kib, "SHMEM"),
    (Scale::Kib, "RSS/s"),
    (Scale::Count, "FLT/s"),
    (Scale::Count, "KFLT/s"),
    (Scale::Count, "FFLT/s"),
    (Scale::Count, "BRK/s"),
    (Scale::Kib, "BRKB/s"),
    (Scale::Count, "MMAP/s"),
    (Scale::Kib, "MMAPB/s"),
    (Scale::Count, "RECLms/s"),
    (Scale::Whole, "OOM"),
    (Scale::Whole, "CONTAINER"),
    (Scale::Whole, "CGROUP"),
];

/// After PID, COMM and the sort column, the columns kept longest as the
/// terminal narrows: what holds memory and how fast it grows, then who
/// would be killed and where, then the rates behind the growth.
const PRIORITY: [usize; 15] = [2, 5, 6, 3, 14, 15, 16, 13, 4, 10, 12, 7, 8, 9, 11];

/// Which processes are shown: a name or cgroup substring, or a pid.
#[derive(Clone, Debug, Default)]
pub struct Filter(pub String);

impl Filter {
    pub fn matches(&self, p: &Proc) -> bool {
        let f = self.0.trim();
        if f.is_empty() {
            return true;
        }
        if let Ok(pid) = f.parse::<u32>() {
            return p.pid == pid;
        }
        p.comm.contains(f) || p.cgroup.contains(f)
    }
}

fn sort_value(s: &Snapshot, p: &Proc, k: SortKey) -> f64 {
    let l = &p.last;
    match k {
        SortKey::Pid | SortKey::Name => 0.0,
        SortKey::Anon => p.rss_anon() as f64,
        SortKey::File => p.rss_file() as f64,
        SortKey::Shmem => p.rss_shmem() as f64,
        SortKey::Faults => s.rate(l.faults_user + l.faults_kernel),
        SortKey::Kfaults => s.rate(l.faults_kernel),
        SortKey::Ffaults => s.rate(l.file_faults),
        SortKey::Brk => s.rate(l.brk_calls),
        SortKey::Mmap => s.rate(l.mmap_calls),
        SortKey::Reclaim => s.rate(l.reclaim_ns),
    }
}

/// The processes to show, sorted (largest first, pid and name ascending),
/// at most `max`. Gone processes show only for the interval they ended in.
pub fn select<'a>(s: &'a Snapshot, key: SortKey, filter: &Filter, max: usize) -> Vec<&'a Proc> {
    let mut v: Vec<&Proc> = s
        .procs
        .values()
        .filter(|p| p.gone.is_none() || p.last.activity() > 0)
        .filter(|p| filter.matches(p))
        .collect();
    match key {
        SortKey::Pid => v.sort_by_key(|p| p.pid),
        SortKey::Name => v.sort_by(|a, b| a.comm.cmp(&b.comm).then(a.pid.cmp(&b.pid))),
        _ => v.sort_by(|a, b| {
            sort_value(s, b, key)
                .total_cmp(&sort_value(s, a, key))
                .then(b.last.activity().cmp(&a.last.activity()))
                .then(a.pid.cmp(&b.pid))
        }),
    }
    v.truncate(max);
    v
}

pub fn row(s: &Snapshot, p: &Proc) -> Row {
    let l = &p.last;
    let rate = |v: u64| Value::F(s.rate(v), 1);
    let kb_rate = |v: u64| Value::F(s.rate(v) / 1024.0, 1);
    Row(vec![
        p.pid.into(),
        p.comm.clone().into(),
        (p.rss_anon() >> 10).into(),
        (p.rss_file() >> 10).into(),
        (p.rss_shmem() >> 10).into(),
        Value::F(s.rate_signed(p.rss_growth) / 1024.0, 1),
        rate(l.faults_user),
        rate(l.faults_kernel),
        rate(l.file_faults),
        rate(l.brk_calls),
        kb_rate(l.brk_bytes),
        rate(l.mmap_calls),
        kb_rate(l.mmap_bytes),
        Value::F(s.rate(l.reclaim_ns) / 1e6, 2),
        match p.gone {
            None => crate::process::proc::oom_score(p.pid).map_or(Value::S("-".into()), Into::into),
            Some(_) => Value::S("-".into()),
        },
        // The container its group names (short id, as `docker ps`).
        crate::process::container::of_cgroup(&p.cgroup)
            .map_or("-".to_string(), |c| c.id[..12].to_string())
            .into(),
        p.cgroup.clone().into(),
    ])
}

/// The column a sort key sorts by.
fn sort_column(k: SortKey) -> usize {
    match k {
        SortKey::Pid => 0,
        SortKey::Name => 1,
        SortKey::Anon => 2,
        SortKey::File => 3,
        SortKey::Shmem => 4,
        SortKey::Faults => 6,
        SortKey::Kfaults => 7,
        SortKey::Ffaults => 8,
        SortKey::Brk => 9,
        SortKey::Mmap => 11,
        SortKey::Reclaim => 13,
    }
}

/// The columns that fit `width` terminal cells, each as wide as its widest
/// cell (`need`, header included) and one apart, in table order: PID, COMM
/// and the sort column always, the others by `PRIORITY` while they fit,
/// whole or not at all (the caller says how many were left out).
pub fn fit(need: &[usize], width: usize, sort: SortKey) -> Vec<usize> {
    let mut shown = vec![0, 1];
    if !shown.contains(&sort_column(sort)) {
        shown.push(sort_column(sort));
    }
    let mut used: usize = shown.iter().map(|&i| need[i] + 1).sum();
    for i in PRIORITY {
        if !shown.contains(&i) && used + need[i] < width {
            used += need[i] + 1;
            shown.push(i);
        }
    }
    shown.sort_unstable();
    shown
}

/// The help line: each sort key, the one in force marked.
pub fn keys_line(current: SortKey) -> String {
    let keys: Vec<String> = SortKey::KEYS
        .iter()
        .map(|(c, k, label)| {
            if *k == current {
                format!("[{c}]{label}*")
            } else {
                format!("{c}:{label}")
            }
        })
        .collect();
    format!("sort {}  /:filter  Enter:details  q:quit", keys.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::snapshot::Figures;

    #[test]
    fn narrow_terminals_drop_whole_columns_by_priority_and_keep_the_sort_column() {
        // 17 columns: PID 7, COMM 15, the rest 9.
        let mut need = vec![7, 15];
        need.extend([9; 15]);
        // Everything fits in 200 cells.
        assert_eq!(fit(&need, 200, SortKey::Anon).len(), 17);
        // 80 cells: PID, COMM and MMAP/s (the sort) take 34, leaving room
        // for four more of 10: ANON, RSS/s, FLT/s and FILE, in that order.
        let f = fit(&need, 80, SortKey::Mmap);
        assert_eq!(f, vec![0, 1, 2, 3, 5, 6, 11]);
        assert!(f.iter().map(|&i| need[i] + 1).sum::<usize>() <= 80);
        // Narrower than the three that must stay: they stay.
        assert_eq!(fit(&need, 20, SortKey::Reclaim), vec![0, 1, 13]);
        // Sorted by pid, nothing is counted twice.
        assert_eq!(fit(&need, 24, SortKey::Pid), vec![0, 1]);
    }

    #[test]
    fn every_column_has_a_priority_or_always_shows() {
        let mut all: Vec<usize> = PRIORITY.to_vec();
        all.extend([0, 1]);
        all.sort_unstable();
        assert_eq!(all, (0..COLS.len()).collect::<Vec<_>>());
        assert_eq!(SHORT.len(), COLS.len());
    }

    fn snap() -> Snapshot {
        let mut s = Snapshot::new(2);
        let add = |s: &mut Snapshot, pid, comm: &str, cg: &str, last: Figures, anon| {
            let mut p = Proc {
                pid,
                comm: comm.into(),
                cgroup: cg.into(),
                last,
                ..Default::default()
            };
            p.rss[memtrace_common::rss::ANON] = anon;
            s.procs.insert(pid, p);
        };
        let f = |faults, brk| Figures {
            faults_user: faults,
            brk_calls: brk,
            ..Default::default()
        };
        add(&mut s, 10, "redis-server", "/db", f(500, 0), 4 << 20);
        add(&mut s, 20, "make", "/build", f(900, 3), 1 << 20);
        add(&mut s, 30, "malloc-test", "/build", f(10, 70), 9 << 20);
        s
    }

    fn pids(v: &[&Proc]) -> Vec<u32> {
        v.iter().map(|p| p.pid).collect()
    }

    #[test]
    fn sorts_by_the_key_largest_first() {
        let s = snap();
        let all = Filter::default();
        assert_eq!(pids(&select(&s, SortKey::Faults, &all, 10)), [20, 10, 30]);
        assert_eq!(pids(&select(&s, SortKey::Brk, &all, 10)), [30, 20, 10]);
        assert_eq!(pids(&select(&s, SortKey::Anon, &all, 2)), [30, 10]);
        assert_eq!(pids(&select(&s, SortKey::Name, &all, 10)), [20, 30, 10]);
    }

    #[test]
    fn filters_by_name_cgroup_or_pid() {
        let s = snap();
        let by = |f: &str| pids(&select(&s, SortKey::Pid, &Filter(f.into()), 10));
        assert_eq!(by("redis"), [10]);
        assert_eq!(by("/build"), [20, 30]);
        assert_eq!(by("30"), [30]);
        assert!(by("nothing").is_empty());
    }

    #[test]
    fn every_sort_key_is_on_the_help_line() {
        for (c, k, label) in SortKey::KEYS {
            assert_eq!(SortKey::from_key(c), Some(k));
            assert!(keys_line(SortKey::Pid).contains(&format!("{c}:{label}")) || k == SortKey::Pid);
        }
        assert!(keys_line(SortKey::Brk).contains("[b]brk*"));
    }
}
