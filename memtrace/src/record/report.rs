//! `memtrace report FILE`: the recorded reports through the live tools'
//! printers (merged the same way), so a report reads as the run did, with
//! the annotations of each stack and flame graphs.

use std::io::Write;
use std::path::Path;

use super::annotate::Annotations;
use super::args::{ReportArgs, ViewArgs};
use super::format::{Recording, Stack};
use crate::error::{Error, Result};
use crate::output::frame::fingerprint_text;
use crate::output::frame::FrameStyle;
use crate::output::{self, fold, merge_stacks, Format, StackReport};

/// One report of a recording: its kind, title and stacks.
pub struct Group<'a> {
    /// Where it was in the file (the first report, when summed).
    pub seq: u64,
    pub kind: &'a str,
    pub title: &'a str,
    pub stacks: Vec<&'a Stack>,
}

/// The reports as recorded, one group each.
pub fn each(rec: &Recording) -> Vec<Group<'_>> {
    rec.reports
        .iter()
        .map(|r| Group {
            seq: r.seq,
            kind: &r.kind,
            title: &r.title,
            stacks: r.stacks.iter().collect(),
        })
        .collect()
}

/// One group per kind of report, summing the intervals. What is outstanding
/// (memleak) is a state, not a flow: its last report is the sum.
pub fn summed(rec: &Recording) -> Vec<Group<'_>> {
    let mut out: Vec<Group> = Vec::new();
    for r in &rec.reports {
        let state = r.stacks.iter().any(|s| s.alloc.is_some());
        match out.iter_mut().find(|g| g.kind == r.kind) {
            Some(g) => {
                if state {
                    g.stacks.clear();
                }
                g.stacks.extend(r.stacks.iter());
                g.title = &r.title;
            }
            None => out.push(Group {
                seq: r.seq,
                kind: &r.kind,
                title: &r.title,
                stacks: r.stacks.iter().collect(),
            }),
        }
    }
    out
}

/// The frame style asked for, else the one the live tool printed.
pub fn style(view: &ViewArgs, rec: &Recording) -> FrameStyle {
    match (view.lines, view.addresses) {
        (true, _) => FrameStyle::Lines,
        (_, true) => FrameStyle::Addresses,
        _ => rec.style(),
    }
}

pub fn stack_id(s: &StackReport) -> Option<String> {
    fingerprint_text(&s.kernel, &s.user)
}

/// Merges as the live output did, then applies the annotations: each
/// stack's verdict and note (or "new") joins its note; `ignore` hides it.
pub fn view(
    stacks: &[&Stack],
    style: FrameStyle,
    per_pid: bool,
    notes: Option<&Annotations>,
    all: bool,
) -> Vec<StackReport> {
    let reports: Vec<StackReport> = stacks.iter().map(|s| s.to_report(style)).collect();
    let mut merged = merge_stacks(&reports, per_pid);
    if let Some(a) = notes {
        merged.retain(|s| all || !stack_id(s).is_some_and(|id| a.ignored(&id)));
        for s in &mut merged {
            let Some(id) = stack_id(s) else { continue };
            let label = a.label(&id);
            s.note = Some(match s.note.take() {
                Some(n) => format!("{n}; {label}"),
                None => label,
            });
        }
    }
    merged
}

/// Reads a record, saying on stderr when it was cut short.
pub fn open(path: &Path) -> Result<Recording> {
    let rec = Recording::open(path)?;
    if let Some(w) = rec.warning(&path.display().to_string()) {
        say!("memtrace: warning: {w}");
    }
    Ok(rec)
}

pub fn run(a: &ReportArgs) -> Result<i32> {
    let rec = open(&a.file)?;
    if a.info {
        return info(&rec);
    }
    let notes = Annotations::in_use(a.view.annotations.as_deref())?;
    let style = style(&a.view, &rec);
    let per_pid = a.per_pid || rec.header.per_pid;
    let format = match (a.json, a.folded) {
        (true, _) => Format::Json,
        (_, true) => Format::Folded,
        _ => Format::Text,
    };
    output::stdout_open()?;
    let stdout = std::io::BufWriter::new(std::io::stdout());
    let mut out = output::printer(format, false, Box::new(stdout));
    let groups = if a.sum { summed(&rec) } else { each(&rec) };
    // Tables in their place between the reports (not with --sum: a table
    // is what one interval printed, not a flow to add up).
    let mut tables = rec.tables.iter().filter(|_| !a.sum).peekable();
    let table = |t: &super::table::Table, out: &mut dyn output::Printer| {
        let (kind, cols, rows) = t.for_printer();
        out.table(kind, &t.title, &cols, &rows);
    };
    for g in &groups {
        while let Some(t) = tables.next_if(|t| t.seq < g.seq) {
            table(t, out.as_mut());
        }
        let mut stacks = view(&g.stacks, style, per_pid, notes.as_ref(), a.view.all);
        let top = a.top.unwrap_or(usize::MAX);
        let rest = (stacks.len() > top).then(|| output::Rest::of_stacks(&stacks[top..]));
        stacks.truncate(top);
        // Printers take the kind as a static name, as tools give it.
        let kind: &'static str = Box::leak(g.kind.to_string().into_boxed_str());
        out.stacks(kind, g.title, &stacks);
        if let Some(r) = rest {
            out.rest(kind, &r);
        }
        output::check(out.as_ref())?;
    }
    for t in tables {
        table(t, out.as_mut());
    }
    if rec.reports.is_empty() && rec.tables.is_empty() {
        say!(
            "memtrace: {} holds no reports: {} printed none",
            a.file.display(),
            rec.header.tool
        );
    }
    out.flush();
    output::check(out.as_ref())?;
    super::export(
        &rec,
        &super::Exports {
            pprof: a.pprof.as_deref(),
            otlp: a.otlp.as_deref(),
            push: a.otlp_push.as_ref(),
        },
    )?;
    if let Some(svg) = &a.svg {
        let mut lines = Vec::new();
        for g in summed(&rec) {
            let stacks = view(&g.stacks, style, per_pid, notes.as_ref(), a.view.all);
            lines.extend(stacks.iter().map(fold));
        }
        if lines.is_empty() {
            return Err(Error::Usage(format!(
                "{} holds no stacks to draw",
                a.file.display()
            )));
        }
        let title = format!("memtrace {}", rec.header.args.join(" "));
        write_svg(svg, &title, |w| {
            let mut o = inferno::flamegraph::Options::default();
            o.title = title.clone();
            inferno::flamegraph::from_lines(&mut o, lines.iter().map(String::as_str), w)
        })?;
    }
    Ok(0)
}

/// Writes a flame graph to `path`, rendered in memory first so that a
/// failed render leaves no half graph behind.
pub fn write_svg(
    path: &Path,
    what: &str,
    render: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    let mut buf = Vec::new();
    render(&mut buf).map_err(|e| Error::Runtime(format!("flame graph of {what}: {e}")))?;
    std::fs::write(path, buf).map_err(|e| super::write_error(path, e))?;
    Ok(())
}

/// `--info`: the run the file is of.
fn info(rec: &Recording) -> Result<i32> {
    use output::escape_controls as esc;
    let h = &rec.header;
    let mut t = String::new();
    for (k, v) in [
        ("tool", h.tool.clone()),
        (
            "args",
            h.args
                .iter()
                .map(|a| quoted(a))
                .collect::<Vec<_>>()
                .join(" "),
        ),
        ("kernel", h.kernel.clone()),
        ("host", h.host.clone()),
        ("start", format!("{:.0} (unix time)", h.start)),
        (
            "format",
            format!(
                "{} version {} (memtrace {})",
                h.magic, h.version, h.memtrace
            ),
        ),
        ("reports", rec.reports.len().to_string()),
        ("tables", rec.tables.len().to_string()),
    ] {
        t.push_str(&format!("{k:<9} {}\n", esc(&v)));
    }
    match &rec.trailer {
        Some(tr) => {
            let lost: u64 = tr.lost.iter().map(|(_, n)| n).sum();
            let run = format!("{:.1}s, {} events, {lost} lost", tr.duration_s, tr.events);
            t.push_str(&format!("run       {run}\n"));
        }
        None => t.push_str("run       cut short (no trailer)\n"),
    }
    for (m, id) in &rec.build_ids {
        t.push_str(&format!("build id  {}  {}\n", esc(id), esc(m)));
    }
    let mut out = std::io::stdout().lock();
    out.write_all(t.as_bytes())
        .and_then(|_| out.flush())
        .map_err(Error::Output)?;
    Ok(0)
}

/// An argument as a shell would need it.
fn quoted(a: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    if !a.is_empty() && a.chars().all(plain) {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}
