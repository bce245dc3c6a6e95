//! Stacks that outlive the terminal: `--record FILE` writes every stack
//! report a tool prints; `report`, `diff` and `annotate` read them back.

pub mod annotate;
pub mod args;
mod budget;
pub mod diff;
pub mod format;
mod frame;
pub mod otlp;
mod otlp_proto;
pub mod pprof;
pub mod push;
pub mod report;
mod stream;
pub mod table;
mod writer;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

pub use crate::output::frame::fingerprint_text;
pub use writer::Recorder;

use crate::error::{Error, Result};
use annotate::{Annotations, Entry, DEFAULT_FILE};
use args::AnnotateCmd;

/// Where a record's stacks go besides the report: a pprof file, an OTLP
/// file, an OTLP/HTTP receiver.
#[derive(Default)]
pub struct Exports<'a> {
    pub pprof: Option<&'a Path>,
    pub otlp: Option<&'a Path>,
    pub push: Option<&'a push::Endpoint>,
}

impl Exports<'_> {
    pub fn any(&self) -> bool {
        self.pprof.is_some() || self.otlp.is_some() || self.push.is_some()
    }
}

/// Writes (and sends) the record's stacks where `to` says.
pub fn export(rec: &format::Recording, to: &Exports) -> Result<()> {
    if let Some(path) = to.pprof {
        pprof::write(&pprof::profile(rec), path)?;
    }
    if to.otlp.is_some() || to.push.is_some() {
        let p = otlp::profiles(rec);
        if let Some(path) = to.otlp {
            otlp::write(&p, path)?;
        }
        if let Some(e) = to.push {
            push::push(e, &prost::Message::encode_to_vec(&p))?;
        }
    }
    Ok(())
}

pub fn annotate(cmd: &AnnotateCmd) -> Result<i32> {
    match cmd {
        AnnotateCmd::Add {
            file,
            stack_id,
            note,
            verdict,
            annotations,
        } => {
            let rec = report::open(file)?;
            let want = stack_id.trim().to_ascii_lowercase();
            // Ids as the live tools and report show them (frames by text).
            let mut found: BTreeSet<(String, String)> = BTreeSet::new();
            for r in &rec.reports {
                for s in &r.stacks {
                    let id = s.id();
                    if !want.is_empty() && id.starts_with(&want) {
                        let top: Vec<String> = s
                            .kernel
                            .iter()
                            .chain(&s.user)
                            .take(3)
                            .map(|f| f.render(crate::output::frame::FrameStyle::Function))
                            .collect();
                        found.insert((id, top.join(" <- ")));
                    }
                }
            }
            let ids: BTreeSet<&String> = found.iter().map(|(id, _)| id).collect();
            let (id, comment) = match ids.len() {
                0 => {
                    return Err(Error::Usage(format!(
                        "no stack {stack_id} in {}",
                        file.display()
                    )))
                }
                1 => found.into_iter().next().unwrap(),
                _ => {
                    let list: Vec<&str> = ids.iter().map(|s| s.as_str()).collect();
                    return Err(Error::Usage(format!(
                        "stack id {stack_id} is ambiguous in {}: {}",
                        file.display(),
                        list.join(", ")
                    )));
                }
            };
            let path = Annotations::find(annotations.as_deref())
                .unwrap_or_else(|| PathBuf::from(DEFAULT_FILE));
            let mut db = Annotations::load(&path)?;
            db.entries.insert(
                id.clone(),
                Entry {
                    verdict: *verdict,
                    note: note.replace(['\n', '\r'], " ").trim().to_string(),
                    comment: vec![comment],
                },
            );
            save(&db, &path)?;
            say!("memtrace: {id} {} -> {}", db.label(&id), path.display());
            Ok(0)
        }
        AnnotateCmd::List { annotations } => {
            let Some(path) = Annotations::find(annotations.as_deref()) else {
                say!(
                    "memtrace: no annotations (--annotations, ${} or ./memtrace-annotations.*)",
                    annotate::ENV
                );
                return Ok(0);
            };
            let db = Annotations::load(&path)?;
            let mut text = String::new();
            for (id, e) in &db.entries {
                let stack = e.comment.last().map(|c| format!("  ({c})"));
                let (v, note) = (e.verdict.name(), &e.note);
                text.push_str(&format!(
                    "{id}  {v:<6}  {note}{}\n",
                    stack.unwrap_or_default()
                ));
            }
            // A closed pipe ends quietly, as every other output does.
            let mut out = std::io::stdout().lock();
            std::io::Write::write_all(&mut out, text.as_bytes()).map_err(Error::Output)?;
            Ok(0)
        }
    }
}

/// A file memtrace was asked to write and could not: a path it cannot
/// create is bad input (exit 2); a write that failed (a full disk) is a
/// failure at run time (exit 1), as for the report itself.
pub fn write_error(path: &Path, e: std::io::Error) -> Error {
    use std::io::ErrorKind::*;
    let what = format!("cannot write {}: {e}", path.display());
    match e.kind() {
        NotFound | PermissionDenied | IsADirectory | NotADirectory | ReadOnlyFilesystem => {
            Error::Usage(what)
        }
        _ => Error::Runtime(what),
    }
}

/// Writes the database whole, through a file renamed over the old one: an
/// interrupted write leaves the previous version.
fn save(db: &Annotations, path: &Path) -> Result<()> {
    // Hidden, and not named like a database that `find` would pick.
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(DEFAULT_FILE);
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let bad = |e: std::io::Error| write_error(path, e);
    std::fs::write(&tmp, db.render()).map_err(bad)?;
    std::fs::rename(&tmp, path).map_err(bad)
}
