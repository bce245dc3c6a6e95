//! One file's `.eh_frame` compiled into the rows the kernel programs unwind
//! with (`memtrace_common::kunwind`): gimli evaluates each FDE's CFI into a
//! table; each row becomes a CFA rule (rsp or rbp + offset, or the PLT's
//! expression, or a signal frame's) and where the caller's rbp was saved.
//! Rules the rows cannot
//! express are kept as `UNSUPPORTED` rows (an unwind stops there) and
//! counted.

use std::fs::File;

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EhFrame, LittleEndian, Register, RegisterRule, UnwindContext,
    UnwindSection, X86_64,
};
use memtrace_common::kunwind::{row, UnwindRule};
use object::{Object, ObjectSection};

/// The rule in force from `pc` (relative to the file's stated addresses) up
/// to the next row's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Row {
    pub pc: u32,
    pub rule: UnwindRule,
}

/// Rows of one file, sorted, with what the rows could not express.
#[derive(Debug, Default)]
pub struct FileRows {
    pub rows: Vec<Row>,
    /// Rows whose rule is not expressible (expressions other than the PLT's
    /// and signal frames', offsets out of range).
    pub unsupported: u64,
    /// (file offset, file size, address) of each executable segment.
    pub segments: Vec<(u64, u64, u64)>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum NoRows {
    /// Not an ELF file the parser reads.
    NotElf,
    /// No `.eh_frame` section (a stripped file, or one with only
    /// `.debug_frame`).
    NoEhFrame,
    /// `.eh_frame` could not be parsed.
    Bad,
    /// Addresses past 4 GiB, or more rows than one file may have.
    TooBig,
}

/// The PLT's CFA expression (what binutils writes for `.plt`):
/// rsp + 8 + ((rip & 15) >= N) << 3, N = 10 or 11.
fn plt_threshold(expr: &[u8]) -> Option<i16> {
    match expr {
        [0x77, 8, 0x80, 0, 0x3f, 0x1a, n @ (0x3a | 0x3b), 0x2a, 0x33, 0x24, 0x22] => {
            Some((n - 0x30) as i16)
        }
        _ => None,
    }
}

/// `[DW_OP_breg7 N]` (rsp + N), then whether a `DW_OP_deref` follows.
fn rsp_plus(expr: &[u8]) -> Option<(i64, bool)> {
    let enc = gimli::Encoding {
        format: gimli::Format::Dwarf64,
        version: 4,
        address_size: 8,
    };
    let mut r = gimli::EndianSlice::new(expr, LittleEndian);
    let Ok(gimli::Operation::RegisterOffset {
        register: X86_64::RSP,
        offset,
        ..
    }) = gimli::Operation::parse(&mut r, enc)
    else {
        return None;
    };
    match r.len() {
        0 => Some((offset, false)),
        _ => match gimli::Operation::parse(&mut r, enc) {
            Ok(gimli::Operation::Deref { .. }) if r.is_empty() => Some((offset, true)),
            _ => None,
        },
    }
}

/// A signal trampoline's row (what glibc writes for
/// `__restore_rt`): CFA = *(rsp + N), rip at rsp + N + 8, rbp at rsp + M.
fn signal_row<R: gimli::Reader<Offset = usize>>(
    r: &gimli::UnwindTableRow<usize>,
    ra_reg: Register,
    eh: &EhFrame<R>,
) -> Option<(u8, i16, i8)> {
    let bytes =
        |e: &gimli::UnwindExpression<usize>| Some(e.get(eh).ok()?.0.to_slice().ok()?.into_owned());
    let CfaRule::Expression(cfa) = r.cfa() else {
        return None;
    };
    let (n, true) = rsp_plus(&bytes(cfa)?)? else {
        return None;
    };
    let Some(RegisterRule::Expression(ip)) = r.register(ra_reg) else {
        return None;
    };
    if rsp_plus(&bytes(&ip)?)? != (n + 8, false) {
        return None;
    }
    let Some(RegisterRule::Expression(bp)) = r.register(X86_64::RBP) else {
        return None;
    };
    let (m, false) = rsp_plus(&bytes(&bp)?)? else {
        return None;
    };
    if m % 8 != 0 {
        return None;
    }
    Some((
        row::SIGNAL,
        i16::try_from(n).ok()?,
        i8::try_from(m / 8).ok()?,
    ))
}

/// The row for one CFI row: Err(()) when it cannot be expressed.
fn convert<R: gimli::Reader<Offset = usize>>(
    cfa: &CfaRule<usize>,
    ra: Option<RegisterRule<usize>>,
    rbp: Option<RegisterRule<usize>>,
    eh: &EhFrame<R>,
) -> Result<(u8, i16, i8), ()> {
    if matches!(ra, Some(RegisterRule::Undefined)) {
        return Ok((row::END, 0, 0));
    }
    if !matches!(ra, Some(RegisterRule::Offset(-8))) {
        return Err(());
    }
    let (kind, off) = match cfa {
        CfaRule::RegisterAndOffset { register, offset } => {
            let kind = match *register {
                X86_64::RSP => row::RSP,
                X86_64::RBP => row::RBP,
                _ => return Err(()),
            };
            (kind, i16::try_from(*offset).map_err(|_| ())?)
        }
        CfaRule::Expression(e) => {
            let e = e.get(eh).map_err(|_| ())?;
            let bytes = e.0.to_slice().map_err(|_| ())?;
            (row::PLT, plt_threshold(&bytes).ok_or(())?)
        }
    };
    let rbp = match rbp {
        None | Some(RegisterRule::SameValue) | Some(RegisterRule::Undefined) => 0,
        Some(RegisterRule::Offset(n)) if n % 8 == 0 && n != 0 => {
            i8::try_from(n / 8).map_err(|_| ())?
        }
        Some(_) => return Err(()),
    };
    Ok((kind, off, rbp))
}

/// Compiles `file`'s `.eh_frame`.
pub fn file_rows(file: &File) -> Result<FileRows, NoRows> {
    let cache = object::ReadCache::new(file);
    let obj = object::File::parse(&cache).map_err(|_| NoRows::NotElf)?;
    object_rows(&obj)
}

/// Compiles the `.eh_frame` of the ELF file in `data` (what a process maps:
/// any bytes; the fuzz target `ktables_build`).
pub fn bytes_rows(data: &[u8]) -> Result<FileRows, NoRows> {
    let obj = object::File::parse(data).map_err(|_| NoRows::NotElf)?;
    object_rows(&obj)
}

fn object_rows<'d, R: object::ReadRef<'d>>(obj: &object::File<'d, R>) -> Result<FileRows, NoRows> {
    let segments = crate::stacks::unwind::exec_segments(obj);
    let sec = obj.section_by_name(".eh_frame").ok_or(NoRows::NoEhFrame)?;
    let data = sec.data().map_err(|_| NoRows::Bad)?;
    let mut bases = BaseAddresses::default().set_eh_frame(sec.address());
    if let Some(t) = obj.section_by_name(".text") {
        bases = bases.set_text(t.address());
    }
    if let Some(g) = obj.section_by_name(".got") {
        bases = bases.set_got(g.address());
    }
    let eh = EhFrame::new(data, LittleEndian);
    let mut ctx = Box::new(UnwindContext::new());
    let mut out = FileRows {
        segments,
        ..Default::default()
    };
    // (start, end, row) per CFI row, sorted and gaps filled after.
    let mut spans: Vec<(u64, u64, Row)> = Vec::new();
    let mut entries = eh.entries(&bases);
    while let Some(entry) = entries.next().map_err(|_| NoRows::Bad)? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else {
            continue;
        };
        let Ok(mut table) = fde.rows(&eh, &bases, &mut ctx) else {
            continue;
        };
        let ra_reg: Register = fde.cie().return_address_register();
        while let Ok(Some(r)) = table.next_row() {
            let (start, end) = (r.start_address(), r.end_address());
            if end > u32::MAX as u64 {
                return Err(NoRows::TooBig);
            }
            let conv = if fde.is_signal_trampoline() {
                signal_row(r, ra_reg, &eh).ok_or(())
            } else {
                convert(r.cfa(), r.register(ra_reg), r.register(X86_64::RBP), &eh)
            };
            let (kind, cfa_off, rbp_off) = conv.unwrap_or_else(|()| {
                out.unsupported += 1;
                (row::UNSUPPORTED, 0, 0)
            });
            spans.push((
                start,
                end,
                Row {
                    pc: start as u32,
                    rule: UnwindRule {
                        cfa_off,
                        rbp_off,
                        kind,
                    },
                },
            ));
        }
    }
    spans.sort_by_key(|s| s.0);
    // Function entries no FDE covers (the C runtime's): the caller's rule.
    let covered: Vec<(u64, u64)> = spans.iter().map(|s| (s.0, s.1)).collect();
    let entry = UnwindRule {
        cfa_off: 8,
        rbp_off: 0,
        kind: row::RSP,
    };
    for (start, end) in super::entries::uncovered(&super::entries::function_entries(obj), &covered)
    {
        if end > u32::MAX as u64 {
            continue;
        }
        let r = Row {
            pc: start as u32,
            rule: entry,
        };
        spans.push((start, end, r));
    }
    spans.sort_by_key(|s| s.0);
    let mut last_end = 0u64;
    for (start, end, r) in spans {
        // Between FDEs there is no information: say so, rather than let the
        // previous function's last rule cover it.
        if start > last_end && last_end != 0 {
            push(
                &mut out.rows,
                Row {
                    pc: last_end as u32,
                    ..Default::default()
                },
            );
        }
        push(&mut out.rows, r);
        last_end = last_end.max(end);
    }
    if last_end != 0 {
        push(
            &mut out.rows,
            Row {
                pc: last_end as u32,
                ..Default::default()
            },
        );
    }
    Ok(out)
}

/// Appends `r` unless it only repeats the previous rule (most rows do, past
/// a function's prologue). A row at the previous one's pc replaces it.
fn push(rows: &mut Vec<Row>, r: Row) {
    if let Some(last) = rows.last_mut() {
        if last.rule == r.rule {
            return;
        }
        if last.pc == r.pc {
            *last = r;
            return;
        }
    }
    rows.push(r);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plt_expression_is_recognised_with_both_thresholds() {
        let e = [0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];
        assert_eq!(plt_threshold(&e), Some(11));
        let mut e10 = e;
        e10[6] = 0x3a;
        assert_eq!(plt_threshold(&e10), Some(10));
        e10[1] = 16;
        assert_eq!(plt_threshold(&e10), None);
    }

    #[test]
    fn libc_compiles_to_sorted_rows_with_few_unsupported() {
        let Ok(f) = File::open("/lib/x86_64-linux-gnu/libc.so.6") else {
            eprintln!("skipped: no /lib/x86_64-linux-gnu/libc.so.6");
            return;
        };
        let t = file_rows(&f).unwrap();
        eprintln!("libc: {} rows, {} unsupported", t.rows.len(), t.unsupported);
        assert!(t.rows.len() > 1000);
        assert!(t.rows.windows(2).all(|w| w[0].pc < w[1].pc));
        // A few hand-written expressions, no more.
        assert!(
            t.unsupported < t.rows.len() as u64 / 100,
            "{}",
            t.unsupported
        );
        assert!(!t.segments.is_empty());
        // __restore_rt: the kernel's signal frame, its registers at rsp.
        let sig: Vec<_> = t
            .rows
            .iter()
            .filter(|r| r.rule.kind == row::SIGNAL)
            .collect();
        assert_eq!(sig.len(), 1, "{sig:?}");
        assert_eq!((sig[0].rule.cfa_off, sig[0].rule.rbp_off), (160, 15));
    }

    /// The rule in force at `pc`.
    fn at(t: &FileRows, pc: u64) -> UnwindRule {
        let i = t.rows.partition_point(|r| r.pc as u64 <= pc);
        t.rows[i - 1].rule
    }

    /// `_fini` and the `.fini_array`'s destructor have no FDE; at their
    /// first instruction the caller's rule applies, and only there.
    #[test]
    fn function_entries_without_an_fde_take_the_callers_rule() {
        let path = "/lib/x86_64-linux-gnu/libm.so.6";
        let Ok(data) = std::fs::read(path) else {
            eprintln!("skipped: no {path}");
            return;
        };
        let obj = object::File::parse(&*data).unwrap();
        let fini = obj.section_by_name(".fini").unwrap().address();
        let dtor = obj.section_by_name(".fini_array").unwrap().data().unwrap();
        let dtor = u64::from_le_bytes(dtor[..8].try_into().unwrap());
        let t = bytes_rows(&data).unwrap();
        let entry = UnwindRule {
            cfa_off: 8,
            rbp_off: 0,
            kind: row::RSP,
        };
        for a in [fini, dtor] {
            assert_eq!(at(&t, a), entry, "{a:#x}");
        }
        // `_fini` does `sub $8, %rsp` first: the next instruction is not
        // at the caller's rule, and has no information.
        assert_eq!(at(&t, fini + 4).kind, row::NONE);
    }

    #[test]
    fn rsp_relative_expressions_are_read_and_others_are_not() {
        // DW_OP_breg7 160; DW_OP_deref, as glibc writes for __restore_rt.
        assert_eq!(rsp_plus(&[0x77, 0xa0, 0x01, 0x06]), Some((160, true)));
        assert_eq!(rsp_plus(&[0x77, 0xa8, 0x01]), Some((168, false)));
        // Two derefs, or rbp (breg6) as the base: not a signal frame's.
        assert_eq!(rsp_plus(&[0x77, 0xa0, 0x01, 0x06, 0x06]), None);
        assert_eq!(rsp_plus(&[0x76, 0xa0, 0x01, 0x06]), None);
    }
}
