//! Where a loaded object keeps the addresses of the functions it calls in
//! other objects: its GOT slots (the dynamic relocations that bind a
//! symbol by name, through the PLT or taken as a pointer). Rewriting a
//! slot sends that object's calls elsewhere, as heaptrack's injection does.

use std::collections::HashMap;

use object::{Object, ObjectSegment, ObjectSymbol, ObjectSymbolTable, RelocationFlags};

/// A slot by its address relative to the object's load bias, and the
/// symbol it binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub offset: u64,
    pub name: String,
}

/// The slots of the ELF object in `data` binding one of `names`.
pub fn slots(data: &[u8], names: &[&str]) -> Result<Vec<Slot>, object::Error> {
    let file = object::File::parse(data)?;
    let Some(dynsyms) = file.dynamic_symbol_table() else {
        return Ok(Vec::new());
    };
    let binds = |r_type: u32| match file.architecture() {
        // GLOB_DAT, JUMP_SLOT.
        object::Architecture::X86_64 => r_type == 6 || r_type == 7,
        object::Architecture::Aarch64 => r_type == 1025 || r_type == 1026,
        _ => false,
    };
    let mut out = Vec::new();
    for (offset, rel) in file.dynamic_relocations().into_iter().flatten() {
        let RelocationFlags::Elf { r_type } = rel.flags() else {
            continue;
        };
        let object::RelocationTarget::Symbol(i) = rel.target() else {
            continue;
        };
        if !binds(r_type) || rel.addend() != 0 {
            continue;
        }
        let Ok(name) = dynsyms.symbol_by_index(i).and_then(|s| s.name()) else {
            continue;
        };
        if names.contains(&name) {
            out.push(Slot {
                offset,
                name: name.to_string(),
            });
        }
    }
    Ok(out)
}

/// The functions an object defines (dynamic symbols), by name: their
/// addresses relative to its load bias.
pub fn exports(data: &[u8]) -> Result<HashMap<String, u64>, object::Error> {
    let file = object::File::parse(data)?;
    Ok(file
        .dynamic_symbols()
        .filter(|s| s.is_definition() && s.kind() == object::SymbolKind::Text)
        .filter_map(|s| Some((s.name().ok()?.to_string(), s.address())))
        .collect())
}

/// Every function an object defines, each version apart: (name, address
/// relative to its load bias, size).
pub fn sized_exports(data: &[u8]) -> Result<Vec<(String, u64, u64)>, object::Error> {
    let file = object::File::parse(data)?;
    Ok(file
        .dynamic_symbols()
        .filter(|s| s.is_definition() && s.kind() == object::SymbolKind::Text)
        .filter_map(|s| Some((s.name().ok()?.to_string(), s.address(), s.size())))
        .collect())
}

/// The first loadable segment's address and file offset: an object mapped
/// with that offset at `start` has its load bias at start - address (both
/// page-aligned).
pub fn first_load(data: &[u8]) -> Option<(u64, u64)> {
    let file = object::File::parse(data).ok()?;
    file.segments()
        .map(|s| (s.address(), s.file_range().0))
        .min()
}

/// The load bias of an object whose first segment (`first_load`) is
/// mapped at `start` (from the process's maps, the mapping whose file
/// offset is the segment's, page-aligned).
pub fn bias(start: u64, first: (u64, u64), page: u64) -> u64 {
    start.wrapping_sub(first.0 & !(page - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memtrace_s_own_slots_for_malloc_are_found_and_point_at_it() {
        // This test binary calls malloc through a slot; read where the
        // slot's address leads in our own memory, and it is libc's malloc.
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let found = slots(&exe, &["malloc"]).unwrap();
        assert!(!found.is_empty(), "no malloc slot in this test binary");
        let maps =
            crate::process::maps::parse_maps_bytes(&std::fs::read("/proc/self/maps").unwrap());
        let me = std::fs::read_link("/proc/self/exe").unwrap();
        let first = first_load(&exe).unwrap();
        let start = maps
            .iter()
            .find(|m| *m.file == *me && m.offset == first.1 & !4095)
            .map(|m| m.start)
            .unwrap();
        let slot = bias(start, first, 4096) + found[0].offset;
        // SAFETY: the slot is a mapped, relocated word of this process.
        let value = unsafe { *(slot as *const usize) };
        assert_eq!(value, libc::malloc as *const () as usize);
    }
}
