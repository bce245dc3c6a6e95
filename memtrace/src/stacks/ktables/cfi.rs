//! One section's call frame information (`.eh_frame` or `.debug_frame`)
//! read into spans of rows: gimli evaluates each FDE's CFI into a table;
//! each row becomes a CFA rule (rsp or rbp + offset, or the PLT's
//! expression, or a signal frame's) and where the caller's rbp was saved.
//! Rules the rows cannot express are kept as `UNSUPPORTED` rows (an unwind
//! stops there) and counted.

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EndianSlice, LittleEndian, Register, RegisterRule,
    UnwindContext, UnwindSection, X86_64,
};
use memtrace_common::kunwind::{row, UnwindRule};

use super::build::{NoRows, Row};

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
fn signal_row<R: gimli::Reader<Offset = usize>, S: UnwindSection<R>>(
    r: &gimli::UnwindTableRow<usize>,
    ra_reg: Register,
    eh: &S,
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
fn convert<R: gimli::Reader<Offset = usize>, S: UnwindSection<R>>(
    cfa: &CfaRule<usize>,
    ra: Option<RegisterRule<usize>>,
    rbp: Option<RegisterRule<usize>>,
    eh: &S,
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

/// (start, end, row) for each CFI row of `section`'s FDEs.
pub(super) fn cfi_spans<'a, S: UnwindSection<EndianSlice<'a, LittleEndian>>>(
    section: &S,
    bases: &BaseAddresses,
    unsupported: &mut u64,
) -> Result<Vec<(u64, u64, Row)>, NoRows> {
    let mut ctx = Box::new(UnwindContext::new());
    let mut spans = Vec::new();
    let mut entries = section.entries(bases);
    while let Some(entry) = entries.next().map_err(|_| NoRows::Bad)? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(S::cie_from_offset) else {
            continue;
        };
        let Ok(mut table) = fde.rows(section, bases, &mut ctx) else {
            continue;
        };
        let ra_reg: Register = fde.cie().return_address_register();
        while let Ok(Some(r)) = table.next_row() {
            let (start, end) = (r.start_address(), r.end_address());
            if end > u32::MAX as u64 {
                return Err(NoRows::TooBig);
            }
            let conv = if fde.is_signal_trampoline() {
                signal_row(r, ra_reg, section).ok_or(())
            } else {
                convert(
                    r.cfa(),
                    r.register(ra_reg),
                    r.register(X86_64::RBP),
                    section,
                )
            };
            let (kind, cfa_off, rbp_off) = conv.unwrap_or_else(|()| {
                *unsupported += 1;
                (row::UNSUPPORTED, 0, 0)
            });
            let rule = UnwindRule {
                cfa_off,
                rbp_off,
                kind,
            };
            let r = Row {
                pc: start as u32,
                rule,
            };
            spans.push((start, end, r));
        }
    }
    Ok(spans)
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
    fn rsp_relative_expressions_are_read_and_others_are_not() {
        // DW_OP_breg7 160; DW_OP_deref, as glibc writes for __restore_rt.
        assert_eq!(rsp_plus(&[0x77, 0xa0, 0x01, 0x06]), Some((160, true)));
        assert_eq!(rsp_plus(&[0x77, 0xa8, 0x01]), Some((168, false)));
        // Two derefs, or rbp (breg6) as the base: not a signal frame's.
        assert_eq!(rsp_plus(&[0x77, 0xa0, 0x01, 0x06, 0x06]), None);
        assert_eq!(rsp_plus(&[0x76, 0xa0, 0x01, 0x06]), None);
    }
}
