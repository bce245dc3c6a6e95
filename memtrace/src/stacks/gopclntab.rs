//! `.gopclntab`: the function table the Go runtime keeps for its own
//! tracebacks, which survives `-ldflags=-s -w` when the symbol table does
//! not. Read for a stripped Go binary's names (the symbolizer, through the
//! file, keeping only the table of entries) and for the functions where
//! its stacks start or switch (the unwind tables, from the section's
//! bytes). Go 1.18 and later (the table's magic says which); the bytes are
//! the traced program's, so every offset is checked against the section.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use object::{Object, ObjectSection};

/// Go 1.18-1.19, and 1.20 on.
const MAGICS: [u32; 2] = [0xffff_fff0, 0xffff_fff1];

/// magic, two pads, minLC, ptrSize, then eight words.
const HEADER: usize = 72;

/// Longest name read.
const MAX_NAME: usize = 1024;

/// Functions kept per file: more than any program has, a bound for a
/// crafted table.
const MAX_FUNCS: u64 = 1 << 22;

/// Bytes of the section, read where they are asked for.
trait At {
    fn at(&self, off: u64, buf: &mut [u8]) -> Option<()>;
}

impl At for &[u8] {
    fn at(&self, off: u64, buf: &mut [u8]) -> Option<()> {
        let s = usize::try_from(off).ok()?;
        buf.copy_from_slice(self.get(s..s.checked_add(buf.len())?)?);
        Some(())
    }
}

/// A section of a file: its offset and size there.
struct InFile {
    file: File,
    at: u64,
    size: u64,
}

impl At for InFile {
    fn at(&self, off: u64, buf: &mut [u8]) -> Option<()> {
        if off.checked_add(buf.len() as u64)? > self.size {
            return None;
        }
        self.file.read_exact_at(buf, self.at + off).ok()
    }
}

/// The table's header and its functions' entries.
struct Table {
    size: u64,
    text_start: u64,
    names: u64,
    funcs: u64,
    /// (entry offset from `text_start`, the function's offset in `funcs`),
    /// sorted, with the end sentinel last.
    entries: Vec<(u32, u32)>,
}

impl Table {
    fn read(src: &impl At, size: u64) -> Option<Table> {
        let mut head = [0u8; HEADER];
        src.at(0, &mut head)?;
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
        src.at(funcs, &mut raw)?;
        let entries: Vec<(u32, u32)> = raw
            .chunks_exact(8)
            .map(|c| {
                let w = |i: usize| u32::from_le_bytes(c[i..i + 4].try_into().unwrap());
                (w(0), w(4))
            })
            .collect();
        if !entries.windows(2).all(|w| w[0].0 <= w[1].0) {
            return None;
        }
        Some(Table {
            size,
            text_start,
            names,
            funcs,
            entries,
        })
    }

    /// The name of function `i` (an index into `entries`, not the last).
    fn name(&self, src: &impl At, i: usize) -> Option<String> {
        let func = self.funcs + self.entries.get(i)?.1 as u64;
        let mut f = [0u8; 8];
        src.at(func, &mut f)?;
        let name_off = i32::from_le_bytes(f[4..].try_into().unwrap());
        let start = self.names.checked_add(u64::try_from(name_off).ok()?)?;
        let mut buf = vec![0u8; MAX_NAME.min(self.size.saturating_sub(start) as usize)];
        src.at(start, &mut buf)?;
        let end = buf.iter().position(|&b| b == 0)?;
        let name = std::str::from_utf8(&buf[..end]).ok()?;
        (!name.is_empty()).then(|| name.to_string())
    }

    /// The function holding stated address `addr`.
    fn index_of(&self, addr: u64) -> Option<usize> {
        let rel = u32::try_from(addr.checked_sub(self.text_start)?).ok()?;
        let i = self.entries.partition_point(|e| e.0 <= rel);
        // Before the first function, or past the end sentinel.
        (i > 0 && i < self.entries.len()).then(|| i - 1)
    }

    /// [start, end) of function `i`, stated addresses.
    fn range(&self, i: usize) -> (u64, u64) {
        let at = |j: usize| self.text_start + self.entries[j].0 as u64;
        (at(i), at(i + 1))
    }
}

/// (start, end, name) of the functions of `obj`'s `.gopclntab` whose
/// names are in `wanted` (an ABI suffix, `.abi0`, ignored), sorted.
pub fn functions_named<'d, R: object::ReadRef<'d>>(
    obj: &object::File<'d, R>,
    wanted: &[&str],
) -> Vec<(u64, u64, String)> {
    obj.section_by_name(".gopclntab")
        .and_then(|s| s.data().ok())
        .map_or_else(Vec::new, |data| functions_in(data, wanted))
}

/// `functions_named` on the section's bytes (the fuzz target `gopclntab`).
pub fn functions_in(data: &[u8], wanted: &[&str]) -> Vec<(u64, u64, String)> {
    let Some(t) = Table::read(&data, data.len() as u64) else {
        return Vec::new();
    };
    let mut out: Vec<(u64, u64, String)> = (0..t.entries.len().saturating_sub(1))
        .filter_map(|i| {
            let n = t.name(&data, i)?;
            let bare = n.strip_suffix(".abi0").unwrap_or(&n);
            wanted.contains(&bare).then(|| {
                let (s, e) = t.range(i);
                (s, e, bare.to_string())
            })
        })
        .collect();
    out.sort_unstable();
    out
}

pub struct GoFuncs {
    src: InFile,
    table: Table,
    /// (file offset, size, address) of each executable segment.
    segments: Vec<(u64, u64, u64)>,
}

impl GoFuncs {
    /// The table of the file at `path`, if it is a Go binary of a version
    /// read here. Only the entries are kept; names are read when asked.
    pub fn read(path: &Path) -> Option<GoFuncs> {
        let file = File::open(path).ok()?;
        let (at, size, segments) = {
            let cache = object::ReadCache::new(&file);
            let obj = object::File::parse(&cache).ok()?;
            let sec = obj.section_by_name(".gopclntab")?;
            let (at, size) = sec.file_range()?;
            (at, size, super::unwind::exec_segments(&obj))
        };
        let src = InFile { file, at, size };
        let table = Table::read(&src, size)?;
        Some(GoFuncs {
            src,
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
        self.table.name(&self.src, self.table.index_of(addr)?)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A table of three functions at text 0x1000: "a" [0x1000, 0x1010),
    /// "b.c" [0x1010, 0x1040), "runtime.goexit.abi0" [0x1040, 0x1050).
    fn table() -> Vec<u8> {
        let names = b"\0a\0b.c\0runtime.goexit.abi0\0";
        let funcs_at = HEADER as u64;
        let entries = [(0u32, 32u32), (0x10, 40), (0x40, 48), (0x50, 0)];
        let names_at = funcs_at + 32 + 24;
        let mut v = Vec::new();
        v.extend(MAGICS[1].to_le_bytes());
        v.extend([0, 0, 1, 8]);
        for w in [3u64, 0, 0x1000, names_at, 0, 0, 0, funcs_at] {
            v.extend(w.to_le_bytes());
        }
        for (e, f) in entries {
            v.extend(e.to_le_bytes());
            v.extend(f.to_le_bytes());
        }
        // Three _func records (entryOff, nameOff): at funcs + 32, 40, 48.
        for (e, n) in [(0u32, 1i32), (0x10, 3), (0x40, 7)] {
            v.extend(e.to_le_bytes());
            v.extend(n.to_le_bytes());
        }
        v.extend(names);
        v
    }

    #[test]
    fn functions_are_found_by_address_and_named() {
        let data = table();
        let src = &data[..];
        let t = Table::read(&src, data.len() as u64).unwrap();
        let name = |a| t.index_of(a).and_then(|i| t.name(&src, i));
        assert_eq!(name(0x1000).as_deref(), Some("a"));
        assert_eq!(name(0x103f).as_deref(), Some("b.c"));
        assert_eq!(name(0x1045).as_deref(), Some("runtime.goexit.abi0"));
        assert_eq!(t.range(2), (0x1040, 0x1050));
        // Before the text, and past the end sentinel.
        assert_eq!(name(0xfff), None);
        assert_eq!(name(0x1050), None);
    }

    #[test]
    fn a_damaged_table_reads_as_none() {
        let good = table();
        // Another magic, 4-byte pointers, a count past the section.
        for (at, byte) in [(0, 0u8), (7, 4), (8, 0xff)] {
            let mut d = good.clone();
            d[at] = byte;
            let src = &d[..];
            assert!(Table::read(&src, d.len() as u64).is_none(), "byte {at}");
        }
        // A name offset past the section: no name, no panic.
        let mut d = good.clone();
        let n = d.len();
        d[HEADER + 32 + 4] = 0x7f;
        let src = &d[..];
        let t = Table::read(&src, n as u64).unwrap();
        assert_eq!(t.name(&src, 0), None);
        // Cut short: every read inside it, none past.
        let src = &good[..HEADER + 10];
        assert!(Table::read(&src, src.len() as u64).is_none());
    }
}
