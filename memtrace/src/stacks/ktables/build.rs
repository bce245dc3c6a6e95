//! One file's call frame information compiled into the rows the kernel
//! programs unwind with (`memtrace_common::kunwind`): `.eh_frame`, then
//! `.debug_frame` for code `.eh_frame` does not cover (all of a Go
//! program's own code; `cfi` reads either). A Go binary with neither is
//! walked by frame pointers (`golang`).

use std::fs::File;

use gimli::{BaseAddresses, DebugFrame, EhFrame, LittleEndian};
use memtrace_common::kunwind::{row, UnwindRule};
use object::{Object, ObjectSection};

use super::cfi::cfi_spans;
use super::golang;
use crate::stacks::sections::{section_bytes, SectionError};

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
    /// Where the rows came from.
    pub source: Source,
}

/// Where a file's rows came from, for `-v`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    #[default]
    EhFrame,
    DebugFrame,
    /// `.eh_frame`, and `.debug_frame` for code it does not cover (a Go
    /// program with C in it).
    Both,
    /// No call frame information: a Go binary's frame pointers.
    FramePointers,
}

impl Source {
    pub fn describe(self) -> &'static str {
        match self {
            Source::EhFrame => ".eh_frame",
            Source::DebugFrame => ".debug_frame",
            Source::Both => ".eh_frame and .debug_frame",
            Source::FramePointers => "frame pointers (a Go binary without .debug_frame)",
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum NoRows {
    /// Not an ELF file the parser reads.
    NotElf,
    /// Neither `.eh_frame` nor `.debug_frame` (a stripped file), and not a
    /// Go binary.
    NoEhFrame,
    /// The call frame information could not be parsed.
    Bad,
    /// Addresses past 4 GiB, or more rows than one file may have.
    TooBig,
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

fn section_err(e: SectionError) -> NoRows {
    match e {
        SectionError::Bad => NoRows::Bad,
        SectionError::TooBig => NoRows::TooBig,
    }
}

/// Drops the spans of `extra` that overlap one of `main` (sorted).
fn not_covered(main: &[(u64, u64, Row)], extra: Vec<(u64, u64, Row)>) -> Vec<(u64, u64, Row)> {
    extra
        .into_iter()
        .filter(|&(s, e, _)| {
            // The first span of `main` ending after `s` is the only one
            // that can overlap [s, e) without an earlier one doing so.
            let i = main.partition_point(|m| m.1 <= s);
            main.get(i).is_none_or(|m| m.0 >= e)
        })
        .collect()
}

/// The parts of `extra`'s spans that no span of `main` (sorted, disjoint)
/// covers.
pub(super) fn not_covered_parts(
    main: &[(u64, u64, Row)],
    extra: Vec<(u64, u64, Row)>,
) -> Vec<(u64, u64, Row)> {
    let mut out = Vec::new();
    for (mut s, e, r) in extra {
        let mut i = main.partition_point(|m| m.1 <= s);
        while s < e {
            let next = main.get(i).map_or(e, |m| m.0.min(e));
            if s < next {
                let part = Row { pc: s as u32, ..r };
                out.push((s, next, part));
            }
            match main.get(i) {
                Some(m) if m.0 < e => s = s.max(m.1),
                _ => break,
            }
            i += 1;
        }
    }
    out
}

fn object_rows<'d, R: object::ReadRef<'d>>(obj: &object::File<'d, R>) -> Result<FileRows, NoRows> {
    let segments = crate::stacks::unwind::exec_segments(obj);
    let mut out = FileRows {
        segments,
        ..Default::default()
    };
    let mut spans: Vec<(u64, u64, Row)> = Vec::new();
    let eh_data = section_bytes(obj, ".eh_frame").map_err(section_err)?;
    if let Some(data) = &eh_data {
        let addr = obj.section_by_name(".eh_frame").map_or(0, |s| s.address());
        let mut bases = BaseAddresses::default().set_eh_frame(addr);
        if let Some(t) = obj.section_by_name(".text") {
            bases = bases.set_text(t.address());
        }
        if let Some(g) = obj.section_by_name(".got") {
            bases = bases.set_got(g.address());
        }
        let eh = EhFrame::new(data, LittleEndian);
        spans = cfi_spans(&eh, &bases, &mut out.unsupported)?;
        spans.sort_by_key(|s| s.0);
    }
    // Code `.eh_frame` does not cover, by `.debug_frame` (all of a Go
    // program's own code). Its damage costs only what it would add.
    let debug = match section_bytes(obj, ".debug_frame") {
        Ok(Some(data)) => {
            let mut df = DebugFrame::new(&data, LittleEndian);
            df.set_address_size(8);
            let mut unsupported = 0;
            match cfi_spans(&df, &BaseAddresses::default(), &mut unsupported) {
                Ok(d) => {
                    let d = not_covered(&spans, d);
                    out.unsupported += unsupported;
                    Some(d)
                }
                Err(_) if eh_data.is_some() => None,
                Err(e) => return Err(e),
            }
        }
        Ok(None) => None,
        Err(_) if eh_data.is_some() => None,
        Err(e) => return Err(section_err(e)),
    };
    let go = golang::is_go(obj);
    out.source = match (&eh_data, debug) {
        (Some(_), Some(d)) if !d.is_empty() => {
            spans.extend(d);
            Source::Both
        }
        (None, Some(d)) if !d.is_empty() => {
            spans = d;
            Source::DebugFrame
        }
        // A Go program without `.debug_frame`: its frame pointers where
        // `.eh_frame` (its C code's, if any) says nothing.
        (eh, _) if go => {
            let fp = golang::frame_pointer_spans(&out.segments);
            spans.extend(not_covered_parts(&spans, fp));
            match eh {
                Some(_) => Source::Both,
                None => Source::FramePointers,
            }
        }
        (Some(_), _) => Source::EhFrame,
        (None, _) => return Err(NoRows::NoEhFrame),
    };
    if go {
        let mut all = golang::TOP_FRAMES.to_vec();
        all.extend(golang::SWITCHES);
        let found = golang::functions(obj, &all);
        for (names, kind) in [
            (&golang::TOP_FRAMES[..], row::END),
            (&golang::SWITCHES[..], row::SWITCH),
        ] {
            let ranges: Vec<(u64, u64)> = found
                .iter()
                .filter(|f| names.contains(&f.2.as_str()))
                .map(|f| (f.0, f.1))
                .collect();
            golang::set_rule(&mut spans, &ranges, kind);
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

    fn span(s: u64, e: u64) -> (u64, u64, Row) {
        let r = Row {
            pc: s as u32,
            ..Default::default()
        };
        (s, e, r)
    }

    /// A Go program with C in it: `.eh_frame`'s spans keep their code, the
    /// frame-pointer rule fills what lies between them.
    #[test]
    fn extra_spans_fill_only_what_the_main_ones_leave() {
        let main = [span(10, 20), span(30, 40)];
        let parts = not_covered_parts(&main, vec![span(0, 50)]);
        let got: Vec<_> = parts.iter().map(|p| (p.0, p.1, p.2.pc)).collect();
        assert_eq!(got, [(0, 10, 0), (20, 30, 20), (40, 50, 40)]);
        assert!(not_covered_parts(&main, vec![span(12, 18)]).is_empty());
        // Whole spans: one that overlaps is dropped, one between is kept.
        let kept = not_covered(&main, vec![span(5, 12), span(20, 30), span(39, 45)]);
        let got: Vec<_> = kept.iter().map(|p| (p.0, p.1)).collect();
        assert_eq!(got, [(20, 30)]);
    }
}
