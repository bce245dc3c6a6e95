//! Where code has no FDE but its caller's rule is known anyway: at the
//! first instruction of a function (CFA = rsp + 8, rbp unchanged, the
//! return address on top), before that instruction has run. The C runtime's
//! own functions (`_init`, `_fini`, `__do_global_dtors_aux`, `frame_dummy`)
//! carry no unwind entries, and a process's exit runs them: its fault on
//! their first page ended the stack there.
//!
//! Only the first instruction (and one after `endbr64`, which moves
//! nothing): a return address minus one never falls there (the call before
//! it would have to end inside it). The ELF entry point is left out: what
//! is on top of its stack is argc, not a return address.

use object::{Object, ObjectSection, ObjectSymbol, SectionKind, SymbolKind};

/// `endbr64`.
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// (start, end) of each function entry the file names (its symbols, the
/// `.init` and `.fini` sections, the words of its init and fini arrays)
/// in its code, but the ELF entry point's, sorted.
pub(super) fn function_entries<'d, R: object::ReadRef<'d>>(
    obj: &object::File<'d, R>,
) -> Vec<(u64, u64)> {
    let mut at: Vec<u64> = obj
        .symbols()
        .chain(obj.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0)
        .map(|s| s.address())
        .collect();
    for name in [".init", ".fini"] {
        at.extend(obj.section_by_name(name).map(|s| s.address()));
    }
    if obj.is_64() && obj.is_little_endian() {
        for name in [".preinit_array", ".init_array", ".fini_array"] {
            let Some(data) = obj.section_by_name(name).and_then(|s| s.data().ok()) else {
                continue;
            };
            at.extend(
                data.chunks_exact(8)
                    .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
                    .filter(|a| *a != 0 && *a != u64::MAX),
            );
        }
    }
    let entry = obj.entry();
    at.retain(|a| *a != entry);
    at.sort_unstable();
    at.dedup();
    let code: Vec<_> = obj
        .sections()
        .filter(|s| s.kind() == SectionKind::Text)
        .collect();
    at.into_iter()
        .filter_map(|a| {
            let s = code
                .iter()
                .find(|s| s.address() <= a && a < s.address() + s.size())?;
            let first = s
                .data_range(a, 4)
                .ok()
                .flatten()
                .is_some_and(|b| b == ENDBR64);
            Some((a, if first { a + 5 } else { a + 1 }))
        })
        .collect()
}

/// Those of `entries` that no FDE covers, each cut at the next FDE's
/// start; `spans`: the FDEs' rows, (start, end), sorted by start.
pub(super) fn uncovered(entries: &[(u64, u64)], spans: &[(u64, u64)]) -> Vec<(u64, u64)> {
    entries
        .iter()
        .filter_map(|&(a, b)| {
            // The last span starting at or before `a`, and the next one.
            let i = spans.partition_point(|s| s.0 <= a);
            if i > 0 && spans[i - 1].1 > a {
                return None;
            }
            let end = spans.get(i).map_or(b, |s| s.0.min(b));
            (end > a).then_some((a, end))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_inside_an_fde_are_left_to_it_and_others_cut_at_the_next() {
        let spans = [(0x100, 0x140), (0x200, 0x260)];
        let entries = [
            (0x100, 0x105),
            (0x150, 0x151),
            (0x1fe, 0x203),
            (0x300, 0x301),
        ];
        assert_eq!(
            uncovered(&entries, &spans),
            [(0x150, 0x151), (0x1fe, 0x200), (0x300, 0x301)]
        );
    }
}
