//! `memtrace diff A B`: stacks matched across two records by their id
//! (function names and modules), then what appeared, vanished, grew or
//! shrank, by count and bytes, largest change first.

use std::collections::BTreeMap;
use std::io::Write;

use serde_json::json;

use super::annotate::Annotations;
use super::args::{DiffArgs, SortBy};
use super::format::Recording;
use super::report::{open, stack_id, style, summed, view, write_svg};
use crate::error::{Error, Result};
use crate::output::{escape_controls as esc, fold, StackReport};

/// One stack's totals in one run.
#[derive(Debug, Clone, Default)]
struct Side {
    count: u64,
    bytes: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct Change {
    pub id: String,
    pub status: &'static str,
    pub count: (u64, u64),
    pub bytes: (Option<u64>, Option<u64>),
    /// The stack, as the later run shows it (the earlier if it vanished).
    pub stack: StackReport,
}

impl Change {
    pub fn delta(&self) -> i128 {
        self.count.1 as i128 - self.count.0 as i128
    }
    pub fn delta_bytes(&self) -> i128 {
        self.bytes.1.unwrap_or(0) as i128 - self.bytes.0.unwrap_or(0) as i128
    }
}

/// Every stack of a run, summed by id (across processes and intervals).
fn totals(rec: &Recording, a: &DiffArgs) -> BTreeMap<String, (Side, StackReport)> {
    let style = style(&a.view, rec);
    let mut out: BTreeMap<String, (Side, StackReport)> = BTreeMap::new();
    for g in summed(rec) {
        for s in view(&g.stacks, style, false, None, true) {
            let Some(id) = stack_id(&s) else { continue };
            let e = out
                .entry(id)
                .or_insert_with(|| (Side::default(), s.clone()));
            // Saturating: the counts come from files.
            e.0.count = e.0.count.saturating_add(s.count);
            e.0.bytes = match (e.0.bytes, s.bytes) {
                (Some(x), Some(y)) => Some(x.saturating_add(y)),
                (x, y) => x.or(y),
            };
        }
    }
    out
}

/// The changes from `ra` to `rb`, largest first.
pub fn changes(ra: &Recording, rb: &Recording, a: &DiffArgs) -> Vec<Change> {
    let (ta, mut tb) = (totals(ra, a), totals(rb, a));
    let mut out = Vec::new();
    for (id, (sa, stack_a)) in ta {
        let (sb, stack) = match tb.remove(&id) {
            Some((sb, st)) => (Some(sb), st),
            None => (None, stack_a),
        };
        let status = match &sb {
            None => "vanished",
            Some(b) if (b.count, b.bytes) == (sa.count, sa.bytes) => "same",
            Some(b) if (b.count, b.bytes.unwrap_or(0)) > (sa.count, sa.bytes.unwrap_or(0)) => {
                "grew"
            }
            Some(_) => "shrank",
        };
        let sb = sb.unwrap_or_default();
        out.push(Change {
            id,
            status,
            count: (sa.count, sb.count),
            bytes: (sa.bytes, sb.bytes),
            stack,
        });
    }
    for (id, (sb, stack)) in tb {
        out.push(Change {
            id,
            status: "appeared",
            count: (0, sb.count),
            bytes: (None, sb.bytes),
            stack,
        });
    }
    let key = |c: &Change| match a.by {
        SortBy::Count => (c.delta().abs(), c.delta_bytes().abs()),
        SortBy::Bytes => (c.delta_bytes().abs(), c.delta().abs()),
    };
    out.sort_by(|x, y| key(y).cmp(&key(x)).then(x.id.cmp(&y.id)));
    out
}

fn signed(v: i128) -> String {
    if v > 0 {
        format!("+{v}")
    } else {
        v.to_string()
    }
}

fn opt(v: Option<u64>) -> String {
    v.map(|b| b.to_string()).unwrap_or_else(|| "-".into())
}

pub fn run(a: &DiffArgs) -> Result<i32> {
    let (ra, rb) = (open(&a.a)?, open(&a.b)?);
    let (ta, tb) = (&ra.header.tool, &rb.header.tool);
    if ta != tb && !a.force {
        return Err(Error::Usage(format!(
            "{} is a {ta} record and {} a {tb} record: their counts are of different things (--force compares them anyway)",
            a.a.display(),
            a.b.display()
        )));
    }
    let notes = Annotations::in_use(a.view.annotations.as_deref())?;
    let mut shown = changes(&ra, &rb, a);
    shown.retain(|c| {
        a.view.all || (c.status != "same" && !notes.as_ref().is_some_and(|n| n.ignored(&c.id)))
    });
    if let Some(n) = a.top {
        shown.truncate(n);
    }
    crate::output::stdout_open()?;
    let mut w = std::io::BufWriter::new(std::io::stdout().lock());
    let r = if a.json {
        json_lines(&mut w, &shown, notes.as_ref())
    } else {
        text(&mut w, &shown, notes.as_ref())
    };
    r.and_then(|_| w.flush()).map_err(Error::Output)?;
    if let Some(svg) = &a.svg {
        let folded = |rec: &Recording| -> String {
            let st = style(&a.view, rec);
            let mut s = String::new();
            for g in summed(rec) {
                for r in view(&g.stacks, st, false, None, true) {
                    s.push_str(&fold(&r));
                    s.push('\n');
                }
            }
            s
        };
        let (fa, fb) = (folded(&ra), folded(&rb));
        let title = format!("memtrace diff {} {}", a.a.display(), a.b.display());
        // Widths are the second input's: swapped, with the colours negated
        // (red still grew), the earlier run's stacks are drawn.
        let (first, second) = match a.reverse {
            false => (&fa, &fb),
            true => (&fb, &fa),
        };
        let mut drawn_vanished = 0;
        write_svg(svg, &title, |w| {
            let mut both = Vec::new();
            inferno::differential::from_readers(
                Default::default(),
                first.as_bytes(),
                second.as_bytes(),
                &mut both,
            )?;
            if !a.reverse {
                (both, drawn_vanished) = vanished_drawn(&both);
            }
            let mut o = inferno::flamegraph::Options::default();
            o.title = title.clone();
            o.negate_differentials = a.reverse;
            inferno::flamegraph::from_reader(&mut o, &both[..], w)
        })?;
        if drawn_vanished > 0 {
            say!(
                "memtrace: {drawn_vanished} stacks that vanished are drawn under {VANISHED} in {}, at the earlier run's widths (--reverse draws the earlier run)",
                svg.display()
            );
        }
    }
    Ok(0)
}

/// The root frame the stacks that vanished are drawn under.
const VANISHED: &str = "[vanished: widths from the earlier run]";

/// The differential folded lines (`stack before after`) with the stacks
/// that vanished given a width: a graph of the later run has none for
/// them. Each goes under VANISHED at its earlier count, with a fall of
/// that much (`2n n`), so that it is drawn in the colour of what fell.
/// Returns the lines and how many were moved.
fn vanished_drawn(both: &[u8]) -> (Vec<u8>, usize) {
    let text = String::from_utf8_lossy(both);
    let (mut out, mut n) = (String::with_capacity(text.len()), 0);
    for line in text.lines() {
        let mut parts = line.rsplitn(3, ' ');
        let (after, before, stack) = (parts.next(), parts.next(), parts.next());
        match (stack, before.and_then(|b| b.parse::<u64>().ok()), after) {
            (Some(stack), Some(b), Some("0")) if b > 0 => {
                out.push_str(&format!("{VANISHED};{stack} {} {b}\n", b.saturating_mul(2)));
                n += 1;
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    (out.into_bytes(), n)
}

fn text(w: &mut dyn Write, shown: &[Change], notes: Option<&Annotations>) -> std::io::Result<()> {
    writeln!(
        w,
        "{:<9} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12} {:<12}{}",
        "STATUS",
        "COUNT_A",
        "COUNT_B",
        "DELTA",
        "BYTES_A",
        "BYTES_B",
        "DELTA_BYTES",
        "STACK",
        if notes.is_some() { "  ANNOTATION" } else { "" }
    )?;
    for c in shown {
        let label = notes.map(|n| format!("  {}", esc(&n.label(&c.id))));
        writeln!(
            w,
            "{:<9} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12} {:<12}{}",
            c.status,
            c.count.0,
            c.count.1,
            signed(c.delta()),
            opt(c.bytes.0),
            opt(c.bytes.1),
            signed(c.delta_bytes()),
            c.id,
            label.unwrap_or_default()
        )?;
        for f in c.stack.kernel.iter().chain(&c.stack.user) {
            writeln!(w, "    {}", esc(f))?;
        }
        writeln!(w, "    -- {}", esc(&c.stack.comm))?;
    }
    Ok(())
}

fn json_lines(
    w: &mut dyn Write,
    shown: &[Change],
    notes: Option<&Annotations>,
) -> std::io::Result<()> {
    for c in shown {
        let v = json!({
            "type": "diff",
            "status": c.status,
            "stack_id": c.id,
            "count_a": c.count.0,
            "count_b": c.count.1,
            "delta": c.delta() as i64,
            "bytes_a": c.bytes.0,
            "bytes_b": c.bytes.1,
            "delta_bytes": c.delta_bytes() as i64,
            "annotation": notes.map(|n| n.label(&c.id)),
            "comm": c.stack.comm,
            "user_stack": c.stack.user,
            "kernel_stack": c.stack.kernel,
        });
        writeln!(w, "{v}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vanished_stacks_fall_under_their_own_root_at_their_earlier_width() {
        let (out, n) = vanished_drawn(b"a;b 3 5\na;c 4 0\nd 0 2\n");
        assert_eq!(n, 1);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("a;b 3 5\n{VANISHED};a;c 8 4\nd 0 2\n")
        );
    }
}
