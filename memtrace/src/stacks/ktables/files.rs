//! Each file's rows: compiled once (`build`), placed in the shared array
//! (evicting files no live table refers to when it is full), and kept by
//! the file's identity for code in no process's table yet.

use std::fs::File;
use std::sync::Arc;
use std::time::Instant;

use memtrace_common::kunwind::{FileSegment, UnwindFile, MAX_FILE_SEGMENTS, MAX_UNWIND_MAPPINGS};

use super::{build, file_key, FileId, KTables, Slice, TABLE_FULL};

impl KTables {
    /// The rows of file `id`, compiled and copied into the array the first
    /// time any process maps it.
    pub(super) fn slice(&mut self, id: FileId, path: &str, file: &File) -> Slice {
        if let Some(s) = self.files.get(&id) {
            return s.clone();
        }
        let t0 = Instant::now();
        let built = build::file_rows(file);
        self.place(id, path, built, t0)
    }

    /// Whether file `id` has been placed (with rows or without).
    pub fn knows(&self, id: FileId) -> bool {
        self.files.contains_key(&id)
    }

    /// Places rows built elsewhere (`seed`, outside the lock the event
    /// loop takes) for file `id`, unless it was placed meanwhile.
    pub fn place_built(
        &mut self,
        id: FileId,
        path: &str,
        built: Result<build::FileRows, build::NoRows>,
        t0: Instant,
    ) {
        if !self.knows(id) {
            self.place(id, path, built, t0);
        }
    }

    fn place(
        &mut self,
        id: FileId,
        path: &str,
        built: Result<build::FileRows, build::NoRows>,
        t0: Instant,
    ) -> Slice {
        let source = built.as_ref().map_or(build::Source::EhFrame, |t| t.source);
        let s = match built {
            Ok(t) if t.rows.is_empty() => {
                self.stats.files_no_info += 1;
                Slice::None("no unwind rows")
            }
            Ok(t) => {
                let rules = &mut self.rules;
                let words = super::slice::encode(&t.rows, |r| rules.index(r));
                let first = match &words {
                    None => None,
                    Some(w) => match self.rows.place(w) {
                        Some(f) => Some(f),
                        // Full: the rows no live process's table refers to go.
                        None => {
                            self.evict();
                            self.rows.place(w)
                        }
                    },
                };
                match (first, words) {
                    (Some(first), Some(w)) => {
                        let n = w.len() as u32;
                        self.stats.words += n as u64;
                        self.stats.rows += t.rows.len() as u64;
                        self.stats.rules = self.rules.count();
                        self.stats.rows_unsupported += t.unsupported;
                        self.stats.files += 1;
                        self.share(id, first, n, &t.segments);
                        Slice::Rows {
                            first,
                            n,
                            rows: t.rows.len() as u32,
                            segments: Arc::new(t.segments),
                        }
                    }
                    _ => {
                        self.stats.files_over_budget += 1;
                        // Not only with -v: every stack through this file stops.
                        say!(
                            "memtrace: warning: {path} ({} rows) does not fit what is left of the unwind table: stacks stop in its code (raise --unwind-table-size)",
                            t.rows.len()
                        );
                        Slice::None(TABLE_FULL)
                    }
                }
            }
            Err(e) => {
                self.stats.files_no_info += 1;
                Slice::None(match e {
                    build::NoRows::NotElf => "not an ELF file",
                    build::NoRows::NoEhFrame => "no .eh_frame or .debug_frame",
                    build::NoRows::Bad => "its call frame information could not be parsed",
                    build::NoRows::TooBig => "too large for the unwind table's format",
                })
            }
        };
        self.stats.build_ms += t0.elapsed().as_secs_f64() * 1e3;
        if self.verbose {
            match &s {
                Slice::Rows { n, rows, .. } => say!(
                    "memtrace: unwind table: {path}: {rows} rows from {} in {:.1} KiB ({:.1} ms)",
                    source.describe(),
                    super::table_bytes(*n as u64) as f64 / 1024.0,
                    t0.elapsed().as_secs_f64() * 1e3
                ),
                Slice::None(why) => {
                    say!("memtrace: unwind table: {path}: none ({why}): stacks stop in its code")
                }
            }
        }
        self.files.insert(id, s.clone());
        s
    }

    /// Makes room: the rows of files no process's table in the kernel
    /// refers to (children that copied a table at a fork included, which
    /// memtrace never pushed) go back, and so does their entry by identity.
    /// Files left out for want of room are tried again when next mapped.
    fn evict(&mut self) {
        let mut held = std::collections::HashSet::new();
        for (_, p) in self.procs.iter().filter_map(|e| e.ok()) {
            for m in &p.maps[..(p.nr as usize).min(MAX_UNWIND_MAPPINGS)] {
                if m.nrows > 0 {
                    held.insert(m.rows);
                }
            }
        }
        let gone: Vec<FileId> = self
            .files
            .iter()
            .filter_map(|(id, s)| match s {
                _ if self.pinned.contains(id) => None,
                Slice::Rows { first, .. } if !held.contains(first) => Some(*id),
                Slice::None(TABLE_FULL) => Some(*id),
                _ => None,
            })
            .collect();
        for id in gone {
            let Some(Slice::Rows { first, n, rows, .. }) = self.files.remove(&id) else {
                continue;
            };
            let _ = self.by_file.remove(&file_key(id));
            self.rows.release(first, n);
            self.stats.words -= n as u64;
            self.stats.rows -= rows as u64;
            self.stats.files -= 1;
            self.stats.files_evicted += 1;
        }
    }

    /// Puts file `id`'s rows where the program finds them by the file's
    /// identity, for processes whose table does not hold it yet.
    fn share(&mut self, id: FileId, rows: u32, nrows: u32, segments: &[(u64, u64, u64)]) {
        let mut f = UnwindFile {
            rows,
            nrows,
            nseg: segments.len().min(MAX_FILE_SEGMENTS) as u32,
            ..Default::default()
        };
        for (d, &(off, size, vaddr)) in f.segs.iter_mut().zip(segments) {
            *d = FileSegment { off, size, vaddr };
        }
        if self.by_file.insert(file_key(id), f, 0).is_err() {
            self.stats.files_unshared += 1;
        }
    }
}
