//! Numbers in at most five cells, for `top` on a narrow terminal: a number
//! keeps its magnitude with a unit (206M, 114K), never a cut row of digits.

use crate::output::{Row, Value};

/// Text columns (cgroup paths) count at most this wide when the columns are
/// chosen; the last column shown then takes whatever width is left.
const TEXT_FIT: usize = 24;

/// A table's cells as text, with each column's width and header.
pub struct Cells {
    pub cells: Vec<Vec<String>>,
    /// Each column's widest cell or header.
    pub need: Vec<usize>,
    pub headers: Vec<&'static str>,
}

impl Cells {
    /// `n` columns: `text` renders column i's value, `header` names column
    /// i, and `text_col` says which columns hold text.
    pub fn new(
        n: usize,
        rows: &[Row],
        text: impl Fn(usize, &Value) -> String,
        header: impl Fn(usize) -> &'static str,
        text_col: impl Fn(usize) -> bool,
    ) -> Cells {
        let cells: Vec<Vec<String>> = rows
            .iter()
            .map(|r| r.0.iter().enumerate().map(|(i, v)| text(i, v)).collect())
            .collect();
        let headers: Vec<&'static str> = (0..n).map(&header).collect();
        let need = (0..n)
            .map(|i| {
                let widest = cells.iter().map(|r| r[i].chars().count()).max();
                let w = widest.unwrap_or(0);
                let w = if text_col(i) { w.min(TEXT_FIT) } else { w };
                w.max(headers[i].len())
            })
            .collect();
        Cells {
            cells,
            need,
            headers,
        }
    }
}

/// What a column's numbers are, which picks their units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Kibibytes (or kibibytes a second): K, M, G, T, P of bytes.
    Kib,
    /// Counts (or counts a second): thousands, millions.
    Count,
    /// Shown whole (pids, names, the OOM score).
    Whole,
}

/// `x` in at most five cells (four and a sign): three digits or one and a
/// decimal, then the unit (none for `Whole`, which `cell` never shortens).
pub fn short(x: f64, scale: Scale) -> String {
    let (base, units): (f64, &[&str]) = match scale {
        Scale::Kib => (1024.0, &["K", "M", "G", "T", "P", "E", "Z"]),
        Scale::Count | Scale::Whole => (1000.0, &["", "K", "M", "G", "T", "P", "E"]),
    };
    if x == 0.0 || !x.is_finite() {
        return "0".into();
    }
    let sign = if x < 0.0 { "-" } else { "" };
    let (mut m, mut u) = (x.abs(), 0);
    // 999.5 and up would print as four digits: the next unit instead.
    while m >= 999.5 && u + 1 < units.len() {
        m /= base;
        u += 1;
    }
    let digits = if m < 9.95 && (u > 0 || m.fract() != 0.0) {
        1
    } else {
        0
    };
    format!("{sign}{m:.digits$}{}", units[u])
}

/// A cell's text in a narrow column: numbers through `short`, the rest as is.
pub fn cell(v: &Value, scale: Scale, full: impl Fn(&Value) -> String) -> String {
    match (scale, v) {
        (Scale::Whole, _) => full(v),
        (_, Value::U(n)) => short(*n as f64, scale),
        (_, Value::I(n)) => short(*n as f64, scale),
        (_, Value::F(x, _)) => short(*x, scale),
        _ => full(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kibibytes_take_byte_units() {
        // 205,700 kB is 200.9 MiB.
        assert_eq!(short(205_700.0, Scale::Kib), "201M");
        assert_eq!(short(512.0, Scale::Kib), "512K");
        assert_eq!(short(1536.0, Scale::Kib), "1.5M");
        assert_eq!(short(3.0 * 1024.0 * 1024.0, Scale::Kib), "3.0G");
        assert_eq!(short(-2048.0, Scale::Kib), "-2.0M");
        assert_eq!(short(0.0, Scale::Kib), "0");
    }

    #[test]
    fn counts_take_thousands() {
        assert_eq!(short(113_820.0, Scale::Count), "114K");
        assert_eq!(short(999.0, Scale::Count), "999");
        assert_eq!(short(999.6, Scale::Count), "1.0K");
        assert_eq!(short(2.5, Scale::Count), "2.5");
        assert_eq!(short(7.0, Scale::Count), "7");
        assert_eq!(short(12_345_678.0, Scale::Count), "12M");
    }

    #[test]
    fn never_wider_than_five_cells() {
        let mut x = 0.37;
        while x < 1e18 {
            for s in [Scale::Kib, Scale::Count] {
                for v in [x, -x] {
                    let t = short(v, s);
                    assert!(t.chars().count() <= 5, "{v} as {t}");
                }
            }
            x *= 1.37;
        }
    }
}
