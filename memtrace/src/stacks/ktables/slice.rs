//! A file's rows as the kernel programs read them (`kunwind::slice`): by
//! 64 KiB page of the file's addresses, each row 4 bytes (the low 16 bits
//! of its pc and the index of its rule, each rule kept once in `Rules`).

use std::collections::HashMap;

use memtrace_common::kunwind::{slice, UnwindRule};

use super::build::Row;

const SHIFT: u32 = slice::PAGE_SHIFT;
const STARTS: usize = slice::STARTS as usize;

/// Encodes `rows` (sorted by pc) into a slice; `rule` gives a rule's index,
/// None when the rules table is full.
pub(super) fn encode(
    rows: &[Row],
    mut rule: impl FnMut(UnwindRule) -> Option<u16>,
) -> Option<Vec<u32>> {
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return Some(Vec::new());
    };
    let page0 = first.pc >> SHIFT;
    let pages = (last.pc >> SHIFT) - page0 + 1;
    let mut w = Vec::with_capacity(rows.len() + 2 * pages as usize + STARTS + 1);
    w.extend([page0, pages]);
    w.resize(STARTS + pages as usize + 1, 0);
    let (mut i, mut in_force) = (0, slice::RULE_NONE);
    for p in 0..pages {
        w[STARTS + p as usize] = w.len() as u32;
        let page = page0 + p;
        // Each page starts with the rule in force at its first byte, so that
        // the program's search never looks into the page before.
        let mut last = None;
        if rows.get(i).is_none_or(|r| r.pc != page << SHIFT) {
            w.push(in_force as u32);
            last = Some(in_force);
        }
        while let Some(r) = rows.get(i).filter(|r| r.pc >> SHIFT == page) {
            let idx = rule(r.rule)?;
            if last != Some(idx) {
                w.push((r.pc & 0xffff) << 16 | idx as u32);
                last = Some(idx);
            }
            in_force = idx;
            i += 1;
        }
    }
    w[STARTS + pages as usize] = w.len() as u32;
    Some(w)
}

/// The rules rows name, mapped into memtrace like the rows (a rule to each
/// 8-byte entry); each distinct rule is written once and never taken back
/// (a host has a few thousand).
pub(super) struct Rules {
    ptr: *mut u64,
    len: u32,
    bytes: usize,
    index: HashMap<UnwindRule, u16>,
}

// SAFETY: the mapping is owned by `Rules` and written only through `&mut`.
unsafe impl Send for Rules {}

impl Drop for Rules {
    fn drop(&mut self) {
        if self.bytes > 0 {
            // SAFETY: mapped in `KTables::new` with this length.
            unsafe { libc::munmap(self.ptr.cast(), self.bytes) };
        }
    }
}

impl Rules {
    /// # Safety
    /// `ptr` is a shared, zeroed mapping of `bytes` bytes holding `len`
    /// entries, owned from here on (`bytes` 0: not to be unmapped).
    pub(super) unsafe fn new(ptr: *mut u64, len: u32, bytes: usize) -> Rules {
        // Index 0 is the zeroed rule: no information (`slice::RULE_NONE`).
        let index = HashMap::from([(UnwindRule::default(), slice::RULE_NONE)]);
        Rules {
            ptr,
            len,
            bytes,
            index,
        }
    }

    /// `r`'s index, written to the table the first time it is met.
    pub(super) fn index(&mut self, r: UnwindRule) -> Option<u16> {
        if let Some(&i) = self.index.get(&r) {
            return Some(i);
        }
        let i = u16::try_from(self.index.len()).ok()?;
        if i as u32 >= self.len {
            return None;
        }
        // SAFETY: i < len, inside the mapping; the programs read a rule
        // only through rows published after this write.
        unsafe { self.ptr.add(i as usize).cast::<UnwindRule>().write(r) };
        self.index.insert(r, i);
        Some(i)
    }

    pub(super) fn count(&self) -> u64 {
        self.index.len() as u64
    }

    /// The rule written at `i`, read back from the array.
    #[cfg(test)]
    fn get(&self, i: u16) -> UnwindRule {
        assert!((i as u32) < self.len);
        // SAFETY: inside the mapping.
        unsafe { self.ptr.add(i as usize).cast::<UnwindRule>().read() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule index in force at `rel`, searched as the programs search.
    fn lookup(w: &[u32], rel: u32) -> Option<u16> {
        let page = (rel >> SHIFT).checked_sub(w[0])?;
        if page >= w[1] {
            return None;
        }
        let (first, end) = (w[STARTS + page as usize], w[STARTS + page as usize + 1]);
        let rows = &w[first as usize..end as usize];
        let n = rows.partition_point(|r| r >> 16 <= rel & 0xffff);
        Some((rows[n - 1] & 0xffff) as u16)
    }

    fn rule(kind: u8, cfa_off: i16) -> UnwindRule {
        UnwindRule {
            cfa_off,
            rbp_off: 0,
            kind,
        }
    }

    #[test]
    fn every_address_finds_the_rule_of_the_last_row_at_or_before_it() {
        // Rows across three pages with a page between them that has none,
        // one row at a page's first byte, and rules used many times.
        let pcs = [0x1_0010, 0x1_0020, 0x1_ff00, 0x3_0000, 0x3_0008, 0x4_1234];
        let rules = [
            rule(1, 8),
            rule(1, 16),
            rule(2, 16),
            rule(1, 8),
            rule(1, 16),
            UnwindRule::default(),
        ];
        let rows: Vec<Row> = pcs
            .iter()
            .zip(rules)
            .map(|(&pc, rule)| Row { pc, rule })
            .collect();
        let mut mem = std::mem::ManuallyDrop::new(vec![0u64; 16]);
        // SAFETY: 16 zeroed rules the test owns (bytes 0: not unmapped).
        let mut table = unsafe { Rules::new(mem.as_mut_ptr(), 16, 0) };
        let w = encode(&rows, |r| table.index(r)).unwrap();
        // Three distinct rules beside "none", each written once.
        assert_eq!(table.count(), 4);
        assert_eq!(table.get(1), rule(1, 8));
        // Four bytes a row, plus a header and a row at each page's start.
        assert!(w.len() <= rows.len() + 2 + 5 + 4, "{w:x?}");
        for rel in (0x1_0000..0x4_2000).step_by(4) {
            let want = rows
                .iter()
                .rev()
                .find(|r| r.pc <= rel)
                .map_or(slice::RULE_NONE, |r| table.index(r.rule).unwrap());
            assert_eq!(lookup(&w, rel), Some(want), "at {rel:#x}");
        }
        // Before the first page and past the last: no rule.
        assert_eq!(lookup(&w, 0xfff0), None);
        assert_eq!(lookup(&w, 0x5_0000), None);
    }

    #[test]
    fn libc_encodes_to_half_the_bytes_and_every_row_is_found() {
        let Ok(f) = std::fs::File::open("/lib/x86_64-linux-gnu/libc.so.6") else {
            eprintln!("skipped: no /lib/x86_64-linux-gnu/libc.so.6");
            return;
        };
        let t = super::super::build::file_rows(&f).unwrap();
        let mut mem = std::mem::ManuallyDrop::new(vec![0u64; 1 << 16]);
        // SAFETY: as above.
        let mut table = unsafe { Rules::new(mem.as_mut_ptr(), 1 << 16, 0) };
        let w = encode(&t.rows, |r| table.index(r)).unwrap();
        eprintln!(
            "libc: {} rows, {} words, {} rules",
            t.rows.len(),
            w.len(),
            table.count()
        );
        assert!(w.len() < t.rows.len() * 11 / 10);
        assert!(table.count() < 4096);
        for r in &t.rows {
            let got = lookup(&w, r.pc).map(|i| table.get(i));
            assert_eq!(got, Some(r.rule), "at {:#x}", r.pc);
        }
    }

    #[test]
    fn a_full_rules_table_leaves_the_file_out() {
        let mut mem = std::mem::ManuallyDrop::new(vec![0u64; 2]);
        // SAFETY: as above.
        let mut table = unsafe { Rules::new(mem.as_mut_ptr(), 2, 0) };
        let rows = [
            Row {
                pc: 0,
                rule: rule(1, 8),
            },
            Row {
                pc: 4,
                rule: rule(1, 16),
            },
        ];
        assert!(encode(&rows, |r| table.index(r)).is_none());
        assert!(encode(&[], |r| table.index(r)).unwrap().is_empty());
    }
}
