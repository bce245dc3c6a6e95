//! The annotation database: verdicts and comments keyed by stack id, one
//! line per stack so that a review in git shows one line per change:
//!
//! ```text
//! # grow_heap_with_raw_brk [memtrace-workload] <- main [memtrace-workload]
//! 3f2a9c01b7de  known  heap grows once at start-up
//! ```
//!
//! Lines starting with `#` are comments (memtrace writes the stack's top
//! frames above each entry, for the reviewer).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The environment variable naming the database.
pub const ENV: &str = "MEMTRACE_ANNOTATIONS";
/// The file created in the current directory when none is named.
pub const DEFAULT_FILE: &str = "memtrace-annotations.txt";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Verdict {
    /// Expected: nothing to do.
    Known,
    /// A bug (say which in the note).
    Bug,
    /// Not worth showing: hidden from report and diff.
    Ignore,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Known => "known",
            Verdict::Bug => "bug",
            Verdict::Ignore => "ignore",
        }
    }
    fn parse(s: &str) -> Option<Verdict> {
        match s {
            "known" => Some(Verdict::Known),
            "bug" => Some(Verdict::Bug),
            "ignore" => Some(Verdict::Ignore),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub verdict: Verdict,
    pub note: String,
    /// The comment lines above it.
    pub comment: Vec<String>,
}

#[derive(Debug, Clone, Default)]
pub struct Annotations {
    pub path: Option<PathBuf>,
    pub entries: BTreeMap<String, Entry>,
}

impl Annotations {
    /// The database in use: `--annotations`, else `$MEMTRACE_ANNOTATIONS`,
    /// else `memtrace-annotations.*` in the current directory; None when
    /// there is none (then nothing is flagged).
    pub fn find(explicit: Option<&Path>) -> Option<PathBuf> {
        if let Some(p) = explicit {
            return Some(p.to_path_buf());
        }
        if let Some(p) = std::env::var_os(ENV).filter(|p| !p.is_empty()) {
            return Some(PathBuf::from(p));
        }
        let mut found: Vec<PathBuf> = std::fs::read_dir(".")
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("memtrace-annotations."))
            })
            .collect();
        found.sort();
        found.into_iter().next()
    }

    /// Reads the database at `path`; a missing file is an empty database.
    pub fn load(path: &Path) -> Result<Annotations> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                return Err(Error::Usage(format!("cannot read {}: {e}", path.display())));
            }
        };
        let mut a = Self::parse(&text)
            .map_err(|(n, why)| Error::Usage(format!("{}:{n}: {why}", path.display())))?;
        a.path = Some(path.to_path_buf());
        Ok(a)
    }

    /// The database found by `find`, or an empty one that flags nothing.
    pub fn in_use(explicit: Option<&Path>) -> Result<Option<Annotations>> {
        Self::find(explicit).map(|p| Self::load(&p)).transpose()
    }

    pub fn parse(text: &str) -> std::result::Result<Annotations, (usize, String)> {
        let mut a = Annotations::default();
        let mut comment = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let t = line.trim();
            if t.is_empty() {
                comment.clear();
                continue;
            }
            if let Some(c) = t.strip_prefix('#') {
                comment.push(c.trim().to_string());
                continue;
            }
            let word = |s: &'_ str| -> (String, String) {
                let s = s.trim_start();
                let (w, rest) = s.split_once(char::is_whitespace).unwrap_or((s, ""));
                (w.to_string(), rest.trim().to_string())
            };
            let (id, rest) = word(t);
            let (verdict, note) = word(&rest);
            let (id, verdict) = (id.as_str(), verdict.as_str());
            if id.len() != 12 || !id.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err((i + 1, format!("'{id}' is not a stack id")));
            }
            let Some(verdict) = Verdict::parse(verdict) else {
                return Err((i + 1, format!("'{verdict}' is not known, bug or ignore")));
            };
            a.entries.insert(
                id.to_ascii_lowercase(),
                Entry {
                    verdict,
                    note: note.to_string(),
                    comment: std::mem::take(&mut comment),
                },
            );
        }
        Ok(a)
    }

    /// The text of the database, entries sorted by id.
    pub fn render(&self) -> String {
        let mut s = String::from(
            "# memtrace annotations: STACK-ID VERDICT NOTE, one line per stack (memtrace annotate)\n",
        );
        for (id, e) in &self.entries {
            s.push('\n');
            for c in &e.comment {
                s.push_str(&format!("# {c}\n"));
            }
            s.push_str(&format!("{id}  {}  {}\n", e.verdict.name(), e.note));
        }
        s
    }

    pub fn get(&self, id: &str) -> Option<&Entry> {
        self.entries.get(id)
    }

    /// What a report says of stack `id`: its verdict and note, or "new".
    pub fn label(&self, id: &str) -> String {
        match self.get(id) {
            Some(e) if e.note.is_empty() => e.verdict.name().to_string(),
            Some(e) => format!("{}: {}", e.verdict.name(), e.note),
            None => "new".to_string(),
        }
    }

    pub fn ignored(&self, id: &str) -> bool {
        self.get(id).is_some_and(|e| e.verdict == Verdict::Ignore)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_keeps_comments() {
        let text = "# header\n\n# grow [w] <- main [w]\n0123456789ab  known  heap at start-up\n\nabcdefabcdef bug\n";
        let a = Annotations::parse(text).unwrap();
        assert_eq!(a.entries.len(), 2);
        let e = a.get("0123456789ab").unwrap();
        assert_eq!(e.verdict, Verdict::Known);
        assert_eq!(e.note, "heap at start-up");
        assert_eq!(e.comment, ["grow [w] <- main [w]"]);
        assert_eq!(a.label("abcdefabcdef"), "bug");
        assert_eq!(a.label("000000000000"), "new");
        let again = Annotations::parse(&a.render()).unwrap();
        assert_eq!(again.entries, a.entries);
    }

    #[test]
    fn bad_lines_say_where() {
        let e = Annotations::parse("0123456789ab maybe x\n").unwrap_err();
        assert_eq!(e.0, 1);
        assert!(Annotations::parse("\n\nxyz known\n").unwrap_err().0 == 3);
    }
}
