use std::io::Write;

use super::sink::{putln, Sink};
use super::{Col, Hist, Printer, Rest, Row, Shown, StackReport, Summary, TextPrinter};

/// Folded stacks (`comm;outer;...;inner count`) for flamegraph.pl and inferno;
/// everything that is not a stack prints as text.
pub struct FoldedPrinter {
    out: Sink,
    text: TextPrinter,
}

impl FoldedPrinter {
    pub fn new(out: Box<dyn Write>, timestamps: bool) -> Self {
        FoldedPrinter {
            out: Sink::new(out),
            text: TextPrinter::new(Box::new(std::io::stderr()), timestamps),
        }
    }
}

/// Frames may not contain the separators of the folded format, nor a line
/// break or anything else a terminal acts on (names are the traced system's).
fn clean(f: &str) -> String {
    super::escape_controls(f)
        .replace(';', ":")
        .replace(' ', "_")
}

pub fn fold(s: &StackReport) -> String {
    let mut parts = vec![clean(&s.comm)];
    parts.extend(s.user.iter().rev().map(|f| clean(f)));
    parts.extend(s.kernel.iter().rev().map(|f| clean(f)));
    // A count without frames says why (a stack let go, a failed capture),
    // as the text report does: never a faceless line.
    if s.user.is_empty() && s.kernel.is_empty() {
        let why = s.note.as_deref().unwrap_or("no stack");
        parts.push(clean(&format!("[{why}]")));
    }
    // Leaks weigh by the bytes they hold, as memleak flame graphs do.
    let weight = match (s.alloc, s.bytes) {
        (Some(a), Some(b)) if a.by_bytes => b,
        _ => s.count,
    };
    format!("{} {weight}", parts.join(";"))
}

impl Printer for FoldedPrinter {
    fn event(&mut self, kind: &'static str, cols: &[Col], row: &Row) {
        self.text.event(kind, cols, row)
    }
    fn event_stack(&mut self, kind: &'static str, cols: &[Col], row: &Row, stack: &[Shown]) {
        self.text.event_stack(kind, cols, row, stack)
    }
    fn table(&mut self, kind: &'static str, title: &str, cols: &[Col], rows: &[Row]) {
        self.text.table(kind, title, cols, rows)
    }
    fn stacks(&mut self, _kind: &'static str, _title: &str, stacks: &[StackReport]) {
        for s in stacks {
            putln!(self.out, "{}", fold(s));
        }
        self.out.flush();
    }
    /// Said on stderr with the rest of the text: stdout stays folded lines.
    fn rest(&mut self, kind: &'static str, r: &Rest) {
        self.text.rest(kind, r)
    }
    fn histogram(&mut self, h: &Hist) {
        self.text.histogram(h)
    }
    fn summary(&mut self, s: &Summary) {
        self.text.summary(s)
    }
    fn flush(&mut self) {
        self.text.flush();
        self.out.flush();
    }
    /// The stacks' (stdout) or else the rest's (stderr): both are the report.
    fn error(&self) -> Option<&std::io::Error> {
        self.out.error().or(self.text.error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_first_with_comm() {
        let s = StackReport {
            comm: "my app".into(),
            count: 3,
            user: vec!["inner+0x1".into(), "main+0x2".into()],
            ..Default::default()
        };
        assert_eq!(fold(&s), "my_app;main+0x2;inner+0x1 3");
        let lost = StackReport {
            comm: "sh".into(),
            count: 2,
            note: Some("stack id no longer in the stack map".into()),
            ..Default::default()
        };
        assert_eq!(fold(&lost), "sh;[stack_id_no_longer_in_the_stack_map] 2");
    }
}
