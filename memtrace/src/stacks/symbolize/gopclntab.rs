//! Names for a stripped Go binary's code from `.gopclntab`: the function
//! table the Go runtime keeps for its own tracebacks, which survives
//! `-ldflags=-s -w` when the symbol table does not. Only the table of
//! function entries is kept in memory; a name is read from the file when
//! first asked for (frames are then cached by the caller). Go 1.18 and
//! later (the table's magic says which); the bytes are the traced
//! program's, so every offset is checked against the section.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use object::{Object, ObjectSection};

/// Go 1.18-1.19, and 1.20 on.
const MAGICS: [u32; 2] = [0xffff_fff0, 0xffff_fff1];

/// Longest name read.
const MAX_NAME: usize = 1024;

/// Functions kept per file: more than any program has, a bound for a
/// crafted table.
const MAX_FUNCS: u64 = 1 << 22;

pub struct GoFuncs {
    file: File,
    /// The section's file offset and size.
    at: u64,
    size: u64,
    text_start: u64,
    names: u64,
    funcs: u64,
    /// (entry offset from `text_start`, the function's offset in `funcs`),
    /// sorted, with the end sentinel last.
    table: Vec<(u32, u32)>,
    /// (file offset, size, address) of each executable segment.
    segments: Vec<(u64, u64, u64)>,
}

impl GoFuncs {
    /// The table of the file at `path`, if it is a Go binary of a version
    /// read here.
    pub fn read(path: &Path) -> Option<GoFuncs> {
        let file = File::open(path).ok()?;
        let (at, size, segments) = {
            let cache = object::ReadCache::new(&file);
            let obj = object::File::parse(&cache).ok()?;
            let sec = obj.section_by_name(".gopclntab")?;
            let (at, size) = sec.file_range()?;
            (at, size, crate::stacks::unwind::exec_segments(&obj))
        };
        // magic, two pads, minLC, ptrSize, then eight words.
        let mut head = [0u8; 72];
        file.read_exact_at(&mut head, at).ok()?;
        let magic = u32::from_le_bytes(head[..4].try_into().ok()?);
        // Pointers of 8 bytes only (amd64, arm64).
        if !MAGICS.contains(&magic) || head[4..6] != [0, 0] || head[7] != 8 {
            return None;
        }
        let word = |i: usize| u64::from_le_bytes(head[8 + 8 * i..16 + 8 * i].try_into().unwrap());
        let (nfunc, text_start, names, funcs) = (word(0), word(2), word(3), word(7));
        let table_bytes = nfunc.checked_add(1)?.checked_mul(8)?;
        if nfunc > MAX_FUNCS || funcs.checked_add(table_bytes)? > size || names >= size {
            return None;
        }
        let mut raw = vec![0u8; table_bytes as usize];
        file.read_exact_at(&mut raw, at + funcs).ok()?;
        let table: Vec<(u32, u32)> = raw
            .chunks_exact(8)
            .map(|c| {
                let w = |i: usize| u32::from_le_bytes(c[i..i + 4].try_into().unwrap());
                (w(0), w(4))
            })
            .collect();
        if !table.windows(2).all(|w| w[0].0 <= w[1].0) {
            return None;
        }
        Some(GoFuncs {
            file,
            at,
            size,
            text_start,
            names,
            funcs,
            table,
            segments,
        })
    }

    /// The name of the function holding file offset `off`.
    pub fn name_at(&self, off: u64) -> Option<String> {
        let addr = self
            .segments
            .iter()
            .find(|&&(o, size, _)| off >= o && off < o + size)
            .map(|&(o, _, vaddr)| off - o + vaddr)?;
        let rel = u32::try_from(addr.checked_sub(self.text_start)?).ok()?;
        let i = self.table.partition_point(|e| e.0 <= rel);
        // Before the first function, or past the end sentinel.
        if i == 0 || i >= self.table.len() {
            return None;
        }
        let func = self.funcs + self.table[i - 1].1 as u64;
        let mut f = [0u8; 8];
        self.read_in(func, &mut f)?;
        let name_off = i32::from_le_bytes(f[4..].try_into().unwrap());
        let start = self.names.checked_add(u64::try_from(name_off).ok()?)?;
        let mut buf = vec![0u8; MAX_NAME.min(self.size.saturating_sub(start) as usize)];
        self.read_in(start, &mut buf)?;
        let end = buf.iter().position(|&b| b == 0)?;
        let name = std::str::from_utf8(&buf[..end]).ok()?;
        (!name.is_empty()).then(|| name.to_string())
    }

    /// `buf.len()` bytes at `off` in the section, all inside it.
    fn read_in(&self, off: u64, buf: &mut [u8]) -> Option<()> {
        if off.checked_add(buf.len() as u64)? > self.size {
            return None;
        }
        self.file.read_exact_at(buf, self.at + off).ok()
    }
}

/// Tables by (device, inode); None: not a Go binary read here.
#[derive(Default)]
pub struct GoTables(HashMap<((u32, u32), u64), Option<GoFuncs>>);

impl GoTables {
    pub fn name_at(
        &mut self,
        dev: (u32, u32),
        inode: u64,
        path: &Path,
        off: u64,
    ) -> Option<String> {
        self.0
            .entry((dev, inode))
            .or_insert_with(|| GoFuncs::read(path))
            .as_ref()?
            .name_at(off)
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }
}
