//! Which files name their functions in a symbol table of their own. Those
//! are symbolized from it alone when source lines are not shown: blazesym
//! otherwise parses the file's whole DWARF for names the table already
//! has. A Rust program built with debug info (memtrace's own siblings in
//! the soak) took `brkstack`'s final report to 190 MiB. A file without one
//! (a distribution's stripped libc) still needs its debug file for the
//! names of its local functions.

use std::collections::HashMap;
use std::path::Path;

use object::{Object, ObjectSection};

/// By (device, inode).
#[derive(Default)]
pub struct Symtabs(HashMap<((u32, u32), u64), bool>);

impl Symtabs {
    /// Whether the file at `path` has a `.symtab` with symbols, read from
    /// its section headers only (a file that cannot be read: no).
    pub fn has(&mut self, dev: (u32, u32), inode: u64, path: &Path) -> bool {
        *self
            .0
            .entry((dev, inode))
            .or_insert_with(|| read(path).unwrap_or(false))
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }
}

fn read(path: &Path) -> Option<bool> {
    let f = std::fs::File::open(path).ok()?;
    let cache = object::ReadCache::new(f);
    let file = object::File::parse(&cache).ok()?;
    Some(
        file.section_by_name(".symtab")
            .is_some_and(|s| s.size() > 0),
    )
}
