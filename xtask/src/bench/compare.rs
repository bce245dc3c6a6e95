//! The bench guards itself: each figure of a new run against the same row
//! and column of the committed bench/RESULTS.md, and every one that got
//! more than a fifth worse said (a round doubled start-up and RSS, and
//! nobody noticed: the table was rewritten and never compared).

use std::collections::HashMap;

/// Worse by more than this fraction is a slip.
const SLIP: f64 = 0.2;

/// One figure that slipped.
#[derive(Debug, PartialEq)]
pub struct Slip {
    pub table: String,
    pub row: String,
    pub column: String,
    pub was: f64,
    pub now: f64,
}

impl std::fmt::Display for Slip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} / {} / {}: {} -> {} (+{:.0}%)",
            self.table,
            self.row,
            self.column,
            self.was,
            self.now,
            (self.now / self.was - 1.0) * 100.0
        )
    }
}

/// Columns where more is worse: times, memory and added cost. Rates and
/// counts (calls/s, delivered) are not compared.
fn lower_is_better(column: &str) -> bool {
    let c = column.to_ascii_lowercase();
    (c.contains(" ms") || c.starts_with("ms") || c.contains("mib") || c.contains("ns per"))
        || c.contains("added ns")
        || c.contains("cpu per")
}

/// Tables of a RESULTS.md: header -> (columns, rows by their first cell).
type Tables = HashMap<String, (Vec<String>, HashMap<String, Vec<String>>)>;

fn tables(md: &str) -> Tables {
    let mut out: Tables = HashMap::new();
    let mut current: Option<String> = None;
    for line in md.lines() {
        if let Some(h) = line.strip_prefix("### ") {
            current = Some(h.trim().to_string());
            continue;
        }
        let Some(t) = &current else { continue };
        let Some(inner) = line.trim().strip_prefix('|') else {
            continue;
        };
        let cells: Vec<String> = inner
            .trim_end_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect();
        if cells.iter().all(|c| c.chars().all(|ch| "-: ".contains(ch))) {
            continue;
        }
        let entry = out.entry(t.clone()).or_default();
        if entry.0.is_empty() {
            entry.0 = cells;
        } else if let Some(first) = cells.first().cloned() {
            entry.1.insert(first, cells);
        }
    }
    out
}

/// A figure: the number a cell starts with ("+155" is 155).
fn figure(cell: &str) -> Option<f64> {
    let t = cell.trim().trim_start_matches('+');
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    t[..end].parse().ok()
}

/// The figures of `new` more than a fifth worse than in `old`.
pub fn slips(old: &str, new: &str) -> Vec<Slip> {
    let (old, new) = (tables(old), tables(new));
    let mut out = Vec::new();
    let mut names: Vec<&String> = new.keys().collect();
    names.sort();
    for name in names {
        let (cols, rows) = &new[name];
        let Some((old_cols, old_rows)) = old.get(name) else {
            continue;
        };
        let mut row_names: Vec<&String> = rows.keys().collect();
        row_names.sort();
        for row in row_names {
            let Some(was_row) = old_rows.get(row) else {
                continue;
            };
            for (i, col) in cols.iter().enumerate().skip(1) {
                if !lower_is_better(col) {
                    continue;
                }
                let Some(j) = old_cols.iter().position(|c| c == col) else {
                    continue;
                };
                let (Some(now), Some(was)) = (
                    rows[row].get(i).and_then(|c| figure(c)),
                    was_row.get(j).and_then(|c| figure(c)),
                ) else {
                    continue;
                };
                if was > 0.0 && now > was * (1.0 + SLIP) {
                    out.push(Slip {
                        table: name.clone(),
                        row: row.clone(),
                        column: col.clone(),
                        was,
                        now,
                    });
                }
            }
        }
    }
    out
}

/// Says every slip; with `check`, an error when there is one.
pub fn report(old: &str, new: &str, check: bool) -> anyhow::Result<()> {
    let s = slips(old, new);
    for x in &s {
        eprintln!("bench: worse than the committed bench/RESULTS.md: {x}");
    }
    if s.is_empty() {
        eprintln!("bench: no figure more than 20% worse than the committed bench/RESULTS.md");
    } else if check {
        anyhow::bail!("{} figures more than 20% worse (--check)", s.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "\
### Start-up and peak RSS (10 s)

| tracer | start-up ms (median) | peak RSS MiB (median of 3) |
|---|---:|---:|
| memtrace oomkill | 13.1 | 7.5 |
| memtrace faults | 11.5 | 6.9 |

### Streaming

| threads | calls/s (median) | memtrace CPU per record |
|---:|---:|---:|
| 1 | 311945 | 0.99 us |
";

    #[test]
    fn a_doctored_table_shows_what_slipped_and_only_that() {
        // oomkill's start-up doubled, faults' RSS up 10% (within), the rate
        // halved (not compared), CPU per record up 50%.
        let new = OLD
            .replace("| 13.1 | 7.5 |", "| 24.2 | 7.5 |")
            .replace("| 11.5 | 6.9 |", "| 11.5 | 7.6 |")
            .replace("| 311945 | 0.99 us |", "| 150000 | 1.50 us |");
        let s = slips(OLD, &new);
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(s[0].row, "memtrace oomkill");
        assert_eq!((s[0].was, s[0].now), (13.1, 24.2));
        assert_eq!(s[1].column, "memtrace CPU per record");
        assert!(report(OLD, &new, true).is_err());
        assert!(report(OLD, OLD, true).is_ok());
    }
}
