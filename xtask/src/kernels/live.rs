//! top and serve in the guest (`tests/guest/live.sh`): top's plain-text
//! refreshes show the paced workload's rates, serve's /metrics its exact
//! counts, as tests/top.rs and tests/serve/ check on the host.

use super::check::{Case, Guest};
use super::tools::report;

/// One row of top: (column, value) pairs; empty where the row is missing.
type Row<'a> = Vec<(&'a str, &'a str)>;

/// One refresh of top: the seconds its rates are over (from its title) and
/// the row of the traced process, if shown.
struct Refresh<'a> {
    secs: Option<f64>,
    row: Row<'a>,
}

/// top's refreshes: the row of `pid` under each header (cut by the
/// header's columns); and the pids of any other rows.
fn refreshes<'a>(out: &'a [String], pid: &str) -> (Vec<Refresh<'a>>, Vec<&'a str>) {
    let (mut found, mut others) = (Vec::new(), Vec::new());
    let (mut head, mut secs): (Vec<&str>, Option<f64>) = (Vec::new(), None);
    for l in out {
        let w: Vec<&str> = l.split_whitespace().collect();
        if l.contains(" top: ") {
            secs = l
                .split_once("rates over ")
                .and_then(|(_, r)| r.split_whitespace().next()?.parse().ok());
        } else if w.starts_with(&["PID", "COMM"]) {
            head = w;
            found.push(Refresh {
                secs,
                row: Vec::new(),
            });
        } else if w.first().is_some_and(|p| p.parse::<u32>().is_ok()) {
            match found.last_mut() {
                Some(r) if w[0] == pid => r.row = head.iter().copied().zip(w).collect(),
                _ => others.push(w[0]),
            }
        }
    }
    (found, others)
}

/// `top -p PID -i 700ms`, the process faulting 1000 fresh pages and
/// calling brk 100 times (a page each) a second for 5 s: each refresh's
/// rates times its interval add up to those counts, exactly (the rounding
/// of the printed figures aside), however the emulated guest's clock runs.
pub(super) fn top(g: &Guest, case: &Case, wpid: i64, why: &mut Vec<String>) {
    let out = g.out.get(case.name).map_or(&[][..], |v| v);
    let pid = wpid.to_string();
    let (found, others) = refreshes(out, &pid);
    if found.len() < 5 {
        why.push(format!(
            "{} refreshes, expected 5 s in ones of 700 ms",
            found.len()
        ));
    }
    if !others.is_empty() {
        why.push(format!("rows of other processes than {pid}: {others:?}"));
    }
    if out.iter().any(|l| l.contains('\x1b')) {
        why.push("terminal escapes in plain text".into());
    }
    let mut sums = [0.0f64; 3];
    for (i, r) in found.iter().enumerate() {
        let Some(secs) = r.secs else {
            why.push(format!("refresh {}: no interval in its title", i + 1));
            continue;
        };
        if r.row.is_empty() {
            continue;
        }
        let col = |c: &str| r.row.iter().find(|(h, _)| *h == c).map(|(_, v)| *v);
        if col("COMM") != Some("memtrace-worklo") {
            why.push(format!("refresh {}: COMM {:?}", i + 1, col("COMM")));
        }
        for (n, c) in ["FLT/s", "BRK/s", "BRK_KB/s"].iter().enumerate() {
            match col(c).and_then(|v| v.parse::<f64>().ok()) {
                Some(v) => sums[n] += v * secs,
                None => why.push(format!("refresh {}: {c} {:?}", i + 1, col(c))),
            }
        }
    }
    // A rate to a tenth over an interval to a millisecond: within one a
    // refresh. The way out may fault a few pages more.
    let slack = found.len() as f64;
    for (n, (c, want, more)) in [
        ("faults", 5000.0, 16.0),
        ("brk calls", 500.0, 0.0),
        ("brk KiB", 2000.0, 0.0),
    ]
    .into_iter()
    .enumerate()
    {
        if !(want - slack..=want + more + slack).contains(&sums[n]) {
            why.push(format!(
                "{c}: {:.1} over the refreshes, expected {want} (+{more}) within {slack}",
                sums[n]
            ));
        }
    }
}

/// The value of the series `name` whose labels include every `labels` pair.
fn value(text: &[String], name: &str, labels: &[(&str, &str)]) -> Option<u64> {
    text.iter()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
}

/// serve scraped after `counted 3000 40 25` (3000 fresh pages, 40 mmap
/// calls of 8 KiB, 25 brk calls of a page) and `counted 0 0 0`, the
/// baseline: its faults on the way out are the most the other may add.
pub(super) fn serve(g: &Guest, case: &Case, wpid: i64, why: &mut Vec<String>) {
    let lines = g.work.get(case.name).map_or(&[][..], |v| v);
    let Some(base) = report(g, case.name, "baseline")
        .first()
        .and_then(|w| w.get(1))
        .map(|p| p.to_string())
    else {
        why.push("no scrape of /metrics".into());
        return;
    };
    if lines.last().map(|l| l.as_str()) != Some("# EOF") {
        why.push("the scrape is not OpenMetrics (no # EOF)".into());
    }
    let wp = wpid.to_string();
    let get = |name: &str, pid: &str| value(lines, name, &[("pid", pid)]).unwrap_or(0);
    for (name, want) in [
        ("memtrace_mmap_calls_total", 40),
        ("memtrace_mmap_bytes_total", 40 * 8192),
        ("memtrace_brk_calls_total", 25),
        ("memtrace_brk_bytes_total", 25 * 4096),
    ] {
        let (got, at_base) = (get(name, &wp), get(name, &base));
        if got != want || at_base != 0 {
            why.push(format!(
                "{name}: {got} (baseline {at_base}), expected {want} (0)"
            ));
        }
    }
    let faults = |pid: &str| {
        value(
            lines,
            "memtrace_page_faults_total",
            &[("pid", pid), ("mode", "user")],
        )
        .unwrap_or(0)
    };
    let (got, at_base) = (faults(&wp), faults(&base));
    if !(3000..=3000 + at_base + 2).contains(&got) {
        why.push(format!(
            "{got} user faults, expected 3000 + at most {at_base} + 2"
        ));
    }
    let full = value(
        lines,
        "memtrace_lost_events_total",
        &[("reason", "map_full")],
    );
    if full != Some(0) {
        why.push(format!("map_full losses {full:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::super::check::{parse, CASES};
    use super::*;

    fn case(name: &str) -> &'static Case {
        CASES.iter().find(|c| c.name == name).unwrap()
    }

    /// top's refreshes of pid 489 with these FLT/s, over 0.7 s each; 70
    /// brk calls a refresh (100 a second) of a page.
    fn top_guest(flt: &[&str]) -> Guest {
        let mut s = String::new();
        for f in flt {
            s +=
                "MT-OUT top 19:10:43 top: 1 processes, sorted by faults, rates over 0.700 s; mem\n";
            s += "MT-OUT top     PID COMM              FLT/s    BRK/s  BRK_KB/s CGROUP\n";
            s += &format!("MT-OUT top     489 memtrace-worklo  {f}    100.0     400.0 /\n");
        }
        parse(&s)
    }

    #[test]
    fn top_rates_times_intervals_must_add_up_to_the_counts() {
        let mut why = Vec::new();
        // 5000 faults, 500 brk calls however the refreshes split them.
        let g = top_guest(&[
            "1000.0", "714.3", "1285.7", "1000.0", "1000.0", "1000.0", "1142.9",
        ]);
        top(&g, case("top"), 489, &mut why);
        assert_eq!(
            why.len(),
            2,
            "only the brk sums (7 refreshes of 70): {why:?}"
        );
        why.clear();
        let flt = ["1000.0"; 7];
        let g = top_guest(&flt);
        top(&g, case("top"), 489, &mut why);
        assert_eq!(why.len(), 3, "4900 faults, 490 brk calls: {why:?}");
    }

    #[test]
    fn top_counts_add_up_over_any_split() {
        let mut s = String::new();
        for (f, b) in [
            ("1428.6", "142.9"),
            ("1428.6", "142.9"),
            ("1428.6", "142.9"),
            ("1428.6", "142.9"),
            ("1428.6", "142.9"),
        ] {
            s +=
                "MT-OUT top 19:10:43 top: 1 processes, sorted by faults, rates over 0.700 s; mem\n";
            s += "MT-OUT top     PID COMM              FLT/s    BRK/s  BRK_KB/s CGROUP\n";
            s += &format!(
                "MT-OUT top     489 memtrace-worklo  {f}    {b}     {:.1} /\n",
                b.parse::<f64>().unwrap() * 4.0
            );
        }
        let mut why = Vec::new();
        top(&parse(&s), case("top"), 489, &mut why);
        assert!(why.is_empty(), "{why:?}");
    }

    /// serve's scrape: the workload (pid 8) with `mmaps` mmap calls, the
    /// baseline (pid 7) with its own faults only.
    fn serve_guest(mmaps: u64) -> Guest {
        let lines = [
            "baseline 7".to_string(),
            format!("memtrace_mmap_calls_total{{pid=\"8\",comm=\"w\"}} {mmaps}"),
            "memtrace_mmap_bytes_total{pid=\"8\"} 327680".into(),
            "memtrace_brk_calls_total{pid=\"8\"} 25".into(),
            "memtrace_brk_bytes_total{pid=\"8\"} 102400".into(),
            "memtrace_page_faults_total{pid=\"8\",mode=\"user\"} 3002".into(),
            "memtrace_page_faults_total{pid=\"7\",mode=\"user\"} 3".into(),
            "memtrace_lost_events_total{reason=\"map_full\"} 0".into(),
            "# EOF".into(),
        ];
        parse(
            &lines
                .iter()
                .map(|l| format!("MT-WORK serve {l}\n"))
                .collect::<String>(),
        )
    }

    #[test]
    fn serve_counts_must_be_exact() {
        let mut why = Vec::new();
        serve(&serve_guest(40), case("serve"), 8, &mut why);
        assert!(why.is_empty(), "{why:?}");
        serve(&serve_guest(41), case("serve"), 8, &mut why);
        assert_eq!(why.len(), 1, "{why:?}");
    }

    #[test]
    fn finds_the_row_of_a_pid_under_each_header() {
        let out: Vec<String> = [
            "19:10:43 top: 1 processes, sorted by faults, rates over 1.002 s; mem",
            "    PID COMM              FLT/s    BRK/s CGROUP",
            "     12 memtrace-worklo  1985.6    195.6 /a",
            "19:10:44 top: 2 processes, sorted by faults",
            "    PID COMM              FLT/s    BRK/s CGROUP",
            "     13 sh                  1.0      0.0 /a",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let (found, others) = refreshes(&out, "12");
        assert_eq!(found.len(), 2);
        assert!(found[0].row.contains(&("FLT/s", "1985.6")));
        assert_eq!(found[0].secs, Some(1.002));
        assert!(found[1].row.is_empty());
        assert_eq!(found[1].secs, None);
        assert_eq!(others, ["13"]);
    }
}
