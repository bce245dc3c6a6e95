use std::io::Write;

use super::sink::{putln, to_stderr, Sink};
use super::{
    clock, escape_controls as esc, Col, Hist, Printer, Rest, Row, Shown, StackReport, Summary,
    Value,
};

pub struct TextPrinter {
    out: Sink,
    timestamps: bool,
    header_done: bool,
    /// The line and the cell being put together, kept between lines: a
    /// streamed record is printed in a few microseconds at most, and
    /// allocating per cell was most of that.
    line: String,
    cell: String,
}

const TIME_COL: Col = Col::text("time", "TIME", 8);

impl TextPrinter {
    pub fn new(out: Box<dyn Write>, timestamps: bool) -> Self {
        TextPrinter {
            out: Sink::new(out),
            timestamps,
            header_done: false,
            line: String::new(),
            cell: String::new(),
        }
    }

    /// An empty line between two tables.
    pub fn blank_line(&mut self) {
        putln!(self.out);
    }

    /// Appends one cell, padded to its column (the last left-aligned one is
    /// not padded).
    fn push_cell(line: &mut String, c: &Col, v: &str, first: bool, last: bool) {
        if !first {
            line.push(' ');
        }
        let pad = c.width.saturating_sub(v.chars().count());
        if !c.left {
            line.extend(std::iter::repeat_n(' ', pad));
        }
        line.push_str(v);
        if c.left && !last {
            line.extend(std::iter::repeat_n(' ', pad));
        }
    }

    fn render(&mut self, cols: &[Col], row: &Row, header: bool) {
        use std::fmt::Write as _;
        self.line.clear();
        let mut first = true;
        // -T adds a time column, unless the tool's lines start with one.
        let own_time = cols.first().is_some_and(|c| c.key == TIME_COL.key);
        if self.timestamps && !own_time {
            let t = if header { "TIME".to_string() } else { clock() };
            Self::push_cell(&mut self.line, &TIME_COL, &t, true, cols.is_empty());
            first = false;
        }
        // A row shorter than its columns ends where the row does.
        let n = if header {
            cols.len()
        } else {
            cols.len().min(row.0.len())
        };
        for (i, c) in cols.iter().enumerate().take(n) {
            let last = i + 1 == n;
            if header {
                Self::push_cell(&mut self.line, c, c.header, first, last);
            } else {
                self.cell.clear();
                match &row.0[i] {
                    // Text comes from the traced system: see escape_controls.
                    Value::S(s) => self.cell.push_str(&esc(s)),
                    // Formatting into a String cannot fail.
                    v => {
                        let _ = write!(self.cell, "{v}");
                    }
                }
                Self::push_cell(&mut self.line, c, &self.cell, first, last);
            }
            first = false;
        }
        let end = self.line.trim_end().len();
        self.line.truncate(end);
        self.line.push('\n');
        self.out.put(self.line.as_bytes());
    }
}

impl Printer for TextPrinter {
    fn event(&mut self, _kind: &'static str, cols: &[Col], row: &Row) {
        if !self.header_done {
            self.render(cols, &Row::default(), true);
            self.header_done = true;
        }
        // No flush per event: the session flushes after each batch it drains.
        self.render(cols, row, false);
    }

    fn event_stack(&mut self, kind: &'static str, cols: &[Col], row: &Row, stack: &[Shown]) {
        self.event(kind, cols, row);
        // Frames under their event, indented, as BCC's tools print them.
        for f in stack {
            putln!(self.out, "        {}", esc(f));
        }
        // Flushed by the session after each drained batch.
    }

    fn table(&mut self, _kind: &'static str, title: &str, cols: &[Col], rows: &[Row]) {
        if !title.is_empty() {
            putln!(self.out, "{}", esc(title));
        }
        self.render(cols, &Row::default(), true);
        for r in rows {
            self.render(cols, r, false);
        }
        self.out.flush();
    }

    fn stacks(&mut self, _kind: &'static str, title: &str, stacks: &[StackReport]) {
        if !title.is_empty() {
            putln!(self.out, "{}", esc(title));
        }
        for s in stacks {
            if let Some(a) = &s.alloc {
                alloc_stack(&mut self.out, s, a);
                continue;
            }
            // bpftrace/stackcount shape: frames innermost first, then the count.
            for f in s.kernel.iter().chain(s.user.iter()) {
                putln!(self.out, "    {}", esc(f));
            }
            if let Some(n) = &s.note {
                putln!(self.out, "    [{}]", esc(n));
            }
            let bytes = s.bytes.map(|b| format!(", {b} bytes")).unwrap_or_default();
            let who = match s.processes {
                0 | 1 => s.pid.to_string(),
                n => format!("{} and {} more", s.pid, n - 1),
            };
            // The id that `memtrace annotate` and `diff` know the stack by.
            let id = crate::output::frame::fingerprint_text(&s.kernel, &s.user)
                .map(|id| format!(" stack {id}"))
                .unwrap_or_default();
            putln!(
                self.out,
                "    -- {} ({who}){id}\n        {}{}\n",
                esc(&s.comm),
                s.count,
                bytes
            );
        }
        self.out.flush();
    }

    fn rest(&mut self, _kind: &'static str, r: &Rest) {
        let bytes = r.bytes.map(|b| format!(", {b} bytes")).unwrap_or_default();
        putln!(
            self.out,
            "... and {} more {}, {} events{bytes} (--top shows more)\n",
            r.items,
            r.what,
            r.count
        );
        self.out.flush();
    }

    fn histogram(&mut self, h: &Hist) {
        putln!(self.out, "{}", esc(&h.title));
        let max = h.buckets.iter().copied().max().unwrap_or(0).max(1);
        let first = h.buckets.iter().position(|&n| n > 0).unwrap_or(0);
        let last = h.buckets.iter().rposition(|&n| n > 0).unwrap_or(0);
        for i in first..=last.max(first) {
            let n = h.buckets.get(i).copied().unwrap_or(0);
            let (lo, hi) = Hist::range(i);
            let bar = "@".repeat(((n * 40) / max) as usize);
            let range = format!("[{}, {})", human(lo), human(hi));
            putln!(self.out, "{range:<16} {n:>8} |{bar:<40}|");
        }
        if h.unit.is_empty() {
            return;
        }
        putln!(self.out, "({})", h.unit);
    }

    fn summary(&mut self, s: &Summary) {
        self.out.flush();
        // The summary goes to stderr so that stdout stays parseable.
        let lost: Vec<String> = s
            .lost
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        let lost = if lost.is_empty() {
            "0 lost".to_string()
        } else {
            format!("{} LOST ({})", s.total_lost(), lost.join(" "))
        };
        let mut line = format!(
            "memtrace {}: {:.1}s, {} events, {lost}",
            s.tool, s.duration_s, s.events
        );
        let degraded: Vec<String> = s
            .degraded
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        if !degraded.is_empty() {
            line.push_str(&format!(", degraded (reported): {}", degraded.join(" ")));
        }
        for (k, n) in s.apart.iter().filter(|(_, n)| *n > 0) {
            line.push_str(&format!(
                ", {k}={n} (anywhere on the host, not known to be the target's)"
            ));
        }
        if let Some(st) = s.command_status {
            line.push_str(&format!(", command exited with status {st}"));
        }
        to_stderr(format_args!("{line}"));
    }

    fn flush(&mut self) {
        self.out.flush();
    }

    fn error(&self) -> Option<&std::io::Error> {
        self.out.error()
    }
}

/// 1024 -> "1K", as bpftrace labels histogram buckets.
/// memleak's shape, as BCC prints it: what is outstanding, then the frames
/// one per line, innermost first.
fn alloc_stack(out: &mut Sink, s: &StackReport, a: &super::AllocFigures) {
    let est = if a.estimated { "~" } else { "" };
    let who = match s.processes {
        0 | 1 => format!("{} {}", s.pid, esc(&s.comm)),
        n => format!("{} {} and {} more", s.pid, esc(&s.comm), n - 1),
    };
    let id = crate::output::frame::fingerprint_text(&s.kernel, &s.user)
        .map(|id| format!(" {id}"))
        .unwrap_or_default();
    putln!(
        out,
        "\t{est}{} bytes in {est}{} allocations from stack{id} ({who})",
        s.bytes.unwrap_or(0),
        s.count
    );
    if a.churn {
        putln!(
            out,
            "\t  allocated {est}{} ({est}{} bytes), freed {est}{} ({est}{} bytes)",
            a.allocs,
            a.bytes,
            a.frees,
            a.freed_bytes
        );
    }
    for f in s.kernel.iter().chain(s.user.iter()) {
        putln!(out, "\t\t{}", esc(f));
    }
    if let Some(n) = &s.note {
        putln!(out, "\t\t[{}]", esc(n));
    }
}

pub fn human(v: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "T"),
        (1 << 30, "G"),
        (1 << 20, "M"),
        (1 << 10, "K"),
    ];
    for (n, u) in UNITS {
        if v >= n && v.is_multiple_of(n) {
            return format!("{}{u}", v / n);
        }
    }
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::Value;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn events_get_one_header_and_aligned_columns() {
        let buf = Buf::default();
        let mut p = TextPrinter::new(Box::new(buf.clone()), false);
        let cols = [Col::num("pid", "PID", 7), Col::text("comm", "COMM", 16)];
        p.event("x", &cols, &Row(vec![Value::U(42), "bash".into()]));
        p.event("x", &cols, &Row(vec![Value::U(7), "sh".into()]));
        let s = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(s, "    PID COMM\n     42 bash\n      7 sh\n");
    }

    #[test]
    fn control_characters_from_the_traced_system_are_escaped() {
        let buf = Buf::default();
        let mut p = TextPrinter::new(Box::new(buf.clone()), false);
        let cols = [Col::num("pid", "PID", 3), Col::text("comm", "COMM", 4)];
        let hostile = "a\x1b[2J\nb\u{9b}c\\n\x7f";
        p.event("x", &cols, &Row(vec![Value::U(1), hostile.into()]));
        p.stacks(
            "s",
            "",
            &[StackReport {
                comm: hostile.into(),
                user: vec![hostile.into()],
                ..Default::default()
            }],
        );
        let s = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let want = r"a\x1b[2J\nb\u{9b}c\\n\x7f";
        assert!(s.contains(&format!("  1 {want}\n")), "{s}");
        assert!(s.contains(&format!("    {want}\n")), "{s}");
        assert!(s.contains(&format!("-- {want} (0)")), "{s}");
        assert!(!s.chars().any(|c| c.is_control() && c != '\n'), "{s:?}");
    }

    #[test]
    fn timestamps_add_one_time_column_only() {
        let buf = Buf::default();
        let mut p = TextPrinter::new(Box::new(buf.clone()), true);
        let own = [TIME_COL, Col::num("pid", "PID", 3)];
        p.event("x", &own, &Row(vec!["12:00:00".into(), Value::U(1)]));
        let s = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(s, "TIME     PID\n12:00:00   1\n");

        let buf = Buf::default();
        let mut p = TextPrinter::new(Box::new(buf.clone()), true);
        p.table("t", "", &own[1..], &[Row(vec![Value::U(1)])]);
        let s = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert!(s.starts_with("TIME     PID\n"), "{s}");
        assert_eq!(s.matches(':').count(), 2, "{s}");
    }

    #[test]
    fn histogram_buckets_like_bpftrace() {
        let buf = Buf::default();
        let mut p = TextPrinter::new(Box::new(buf.clone()), false);
        let mut h = Hist::new("lat", "");
        for v in [1500u64, 1600, 3000] {
            h.add(v);
        }
        p.histogram(&h);
        let s = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert!(s.contains("[1K, 2K)"), "{s}");
        assert!(s.contains("[2K, 4K)"), "{s}");
        assert!(
            s.lines()
                .any(|l| l.starts_with("[1K, 2K)") && l.contains(" 2 |")),
            "{s}"
        );
    }

    #[test]
    fn human_units() {
        assert_eq!(human(1024), "1K");
        assert_eq!(human(1 << 20), "1M");
        assert_eq!(human(1000), "1000");
    }
}
