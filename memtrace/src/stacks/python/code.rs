//! A Python code object's name, file and line table, read from the
//! process's memory (`/proc/PID/mem`) once per code object, and the line
//! of an instruction from that table. What is read is whatever the traced
//! process holds there: every length is bounded and every parse checked.

use std::fs::File;
use std::os::unix::fs::FileExt;

use super::layout::Layout;

/// Longest name or file read (longer ones are cut).
const MAX_TEXT: usize = 1024;
/// Largest line table read (a larger one leaves lines unknown).
const MAX_TABLE: usize = 1 << 16;

/// What a frame shows of its code object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Code {
    pub name: String,
    pub file: String,
    pub first_line: u32,
    table: Box<[u8]>,
}

impl Code {
    /// The line of the instruction `units` code units from the code
    /// object's start (as the kernel program writes it).
    pub fn line(&self, units: u64, l: &Layout) -> Option<u32> {
        let at = units.checked_sub(l.co_code as u64 / 2)?;
        line_at(&self.table, self.first_line, at)
    }
}

fn word(mem: &File, at: u64) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    mem.read_exact_at(&mut b, at)?;
    Ok(u64::from_le_bytes(b))
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// The code object at `at`, whose type must be `types[0]` (`PyCode_Type`)
/// and its strings' `types[1]`.
pub fn read_code(mem: &File, at: u64, l: &Layout, types: [u64; 2]) -> std::io::Result<Code> {
    let mut head = vec![0u8; l.co_code as usize];
    mem.read_exact_at(&mut head, at)?;
    let field = |off: u16| {
        let o = off as usize;
        u64::from_le_bytes(head[o..o + 8].try_into().unwrap())
    };
    if field(8) != types[0] {
        return Err(bad("not a code object"));
    }
    let first = {
        let o = l.co_firstlineno as usize;
        u32::from_le_bytes(head[o..o + 4].try_into().unwrap())
    };
    let name = read_str(mem, field(l.co_qualname), l, types[1])?;
    let file = read_str(mem, field(l.co_filename), l, types[1])?;
    let table = read_bytes(mem, field(l.co_linetable)).unwrap_or_default();
    Ok(Code {
        name,
        file,
        first_line: first,
        table: table.into(),
    })
}

/// A `str` object's text: compact strings only (every name and file
/// name the compiler makes is one).
fn read_str(mem: &File, at: u64, l: &Layout, ty: u64) -> std::io::Result<String> {
    if word(mem, at + 8)? != ty {
        return Err(bad("not a string"));
    }
    let len = word(mem, at + 16)? as usize;
    let state = word(mem, at + 32)? as u32;
    let kind = ((state >> 2) & 7) as usize;
    let (compact, ascii) = (state >> 5 & 1 != 0, state >> 6 & 1 != 0);
    if !compact || !matches!(kind, 1 | 2 | 4) {
        return Err(bad("not a compact string"));
    }
    let data = at + if ascii { l.ascii_size } else { l.compact_size } as u64;
    let n = len.min(MAX_TEXT);
    let mut b = vec![0u8; n * kind];
    mem.read_exact_at(&mut b, data)?;
    Ok(decode_text(&b, kind))
}

/// Latin-1, UCS-2 or UCS-4 text as Rust's.
pub fn decode_text(b: &[u8], kind: usize) -> String {
    match kind {
        1 => b.iter().map(|&c| c as char).collect(),
        2 => b
            .chunks_exact(2)
            .map(|c| char::from_u32(u16::from_le_bytes([c[0], c[1]]) as u32).unwrap_or('?'))
            .collect(),
        _ => b
            .chunks_exact(4)
            .map(|c| char::from_u32(u32::from_le_bytes(c.try_into().unwrap())).unwrap_or('?'))
            .collect(),
    }
}

/// A `bytes` object's contents (size at 16, bytes at 32 in every version).
fn read_bytes(mem: &File, at: u64) -> std::io::Result<Vec<u8>> {
    let len = word(mem, at + 16)? as usize;
    if len > MAX_TABLE {
        return Err(bad("line table too large"));
    }
    let mut b = vec![0u8; len];
    mem.read_exact_at(&mut b, at + 32)?;
    Ok(b)
}

/// The line of code unit `unit` from a location table (`co_linetable`,
/// the format of 3.11 on): entries of a first byte (bit 7 set, a code in
/// bits 3-6, the units covered less one in bits 0-2) and the code's
/// varints; lines are deltas from `first`.
pub fn line_at(t: &[u8], first: u32, unit: u64) -> Option<u32> {
    let mut r = Reader { t, i: 0 };
    let mut line = first as i64;
    let mut addr = 0u64;
    while let Some(b) = r.byte() {
        if b & 0x80 == 0 {
            return None;
        }
        let code = (b >> 3) & 15;
        let len = (b & 7) as u64 + 1;
        let delta = match code {
            15 => 0,
            14 => {
                let d = r.svarint()?;
                for _ in 0..3 {
                    r.varint()?;
                }
                d
            }
            13 => r.svarint()?,
            10..=12 => {
                r.byte()?;
                r.byte()?;
                (code - 10) as i64
            }
            _ => {
                r.byte()?;
                0
            }
        };
        line = line.checked_add(delta)?;
        if unit < addr + len {
            return (code != 15 && line > 0).then_some(line.min(u32::MAX as i64) as u32);
        }
        addr += len;
    }
    None
}

struct Reader<'a> {
    t: &'a [u8],
    i: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.t.get(self.i)?;
        self.i += 1;
        Some(b)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut b = self.byte()?;
        let mut v = (b & 63) as u64;
        let mut shift = 0;
        while b & 64 != 0 {
            b = self.byte()?;
            shift += 6;
            if shift > 56 {
                return None;
            }
            v |= ((b & 63) as u64) << shift;
        }
        Some(v)
    }

    fn svarint(&mut self) -> Option<i64> {
        let v = self.varint()?;
        Some(if v & 1 != 0 {
            -((v >> 1) as i64)
        } else {
            (v >> 1) as i64
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table as CPython 3.11 writes it for
    /// `def f():\n    x = 1\n    return x` (first line 1), from
    /// `f.__code__.co_linetable` and `co_positions()`: RESUME on line 1,
    /// then two instructions per line.
    #[test]
    fn a_line_table_gives_each_instruction_its_line() {
        // RESUME (1 unit, line 1, short form), LOAD_CONST+STORE_FAST
        // (2 units, line 2 = +1, one-line form 11), LOAD_FAST+RETURN (2
        // units, line 3, one-line form 11).
        let t = [0x80, 0x00, 0xd9, 0x04, 0x09, 0xd9, 0x0b, 0x0c];
        assert_eq!(line_at(&t, 1, 0), Some(1));
        assert_eq!(line_at(&t, 1, 1), Some(2));
        assert_eq!(line_at(&t, 1, 2), Some(2));
        assert_eq!(line_at(&t, 1, 3), Some(3));
        assert_eq!(line_at(&t, 1, 4), Some(3));
        assert_eq!(line_at(&t, 1, 5), None);
    }

    #[test]
    fn long_and_no_column_forms_and_no_location() {
        // Long form (14): line +10 (svarint 20), end line, columns; then
        // no-column form (13): line -3 (svarint 7); then no location.
        let t = [0xf0, 20, 0, 1, 1, 0xe8, 7, 0xf8];
        assert_eq!(line_at(&t, 5, 0), Some(15));
        assert_eq!(line_at(&t, 5, 1), Some(12));
        assert_eq!(line_at(&t, 5, 2), None);
    }

    #[test]
    fn bad_tables_end_without_a_line() {
        for t in [&[0x00u8][..], &[0xf0], &[0xf0, 0xff, 0xff], &[0xe8]] {
            assert_eq!(line_at(t, 1, 0), None, "{t:?}");
        }
        let many = [0xc0u8 | 7, 0xff].repeat(1000);
        assert_eq!(line_at(&many, 1, u64::MAX), None);
    }

    #[test]
    fn texts_of_each_kind() {
        assert_eq!(decode_text(b"hoard", 1), "hoard");
        assert_eq!(decode_text(&[0xe9, 0], 2), "é");
        assert_eq!(decode_text(&0x1f600u32.to_le_bytes(), 4), "😀");
    }
}
