//! User probe points: which object a process really maps (containers and
//! other libcs included), where a function is in that file, and where in
//! its first instructions a uprobe is cheapest.
//!
//! Why the instruction matters: the kernel replaces the probed instruction
//! with a breakpoint, then either emulates the original (x86-64: `push` of a
//! register, relative `jmp`, `call` and `jcc`, `nop`) or single-steps a copy
//! of it out of line, which costs about ten times more (measured here: a
//! probe on glibc's `free`, whose first instruction is `test %rdi,%rdi`,
//! adds ~9 us a call; on `malloc`, which starts with `push %r12`, ~0.9 us).
//! So when a function's first instruction must be single-stepped, the probe
//! moves to the first later one the kernel emulates, provided every
//! instruction before it runs on every call and leaves the arguments read
//! (and, under a return probe, the stack pointer) as they were.

use std::path::{Path, PathBuf};

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, OpAccess,
    Register,
};
use object::{Object, ObjectSection, ObjectSymbol};

use crate::error::{Error, Result};

/// An object file to probe, as this process reaches it (through the target's
/// root, for processes in other mount namespaces) and as the target names it.
#[derive(Debug, Clone)]
pub struct Library {
    pub path: PathBuf,
    pub shown: String,
}

/// The first mapped object of `pid` (or of memtrace itself) whose file name
/// `matches`.
pub fn mapped_library(pid: Option<u32>, matches: impl Fn(&str) -> bool) -> Option<Library> {
    mapped_libraries(pid, matches).into_iter().next()
}

/// Every file mapped by `pid` (memtrace itself for None) whose name
/// `matches`, in address order, each once.
pub fn mapped_libraries(pid: Option<u32>, matches: impl Fn(&str) -> bool) -> Vec<Library> {
    let maps = match pid {
        Some(p) => crate::process::maps::read_maps(p),
        None => std::fs::read("/proc/self/maps")
            .ok()
            .map(|b| crate::process::maps::parse_maps_bytes(&b)),
    };
    let mut seen = std::collections::HashSet::new();
    maps.unwrap_or_default()
        .into_iter()
        .filter(|m| {
            let name = m.path.rsplit('/').next().unwrap_or("");
            m.path.starts_with('/') && matches(name) && seen.insert(m.path.clone())
        })
        .filter_map(|m| {
            // Opened and checked once, then named by memtrace's own
            // descriptor: the process could map another file at that
            // range before the probes attach.
            let path = match pid {
                Some(p) => m.open_in(p).and_then(crate::process::maps::pinned).ok()?,
                None => m.file.to_path_buf(),
            };
            Some(Library {
                path,
                shown: m.path.to_string(),
            })
        })
        .collect()
}

/// Whether a file name is a C library's: `libc.so.6`, `libc-2.31.so`, musl's
/// `libc.musl-x86_64.so.1` and `ld-musl-*.so.1` (musl's libc is its loader).
pub fn is_libc(name: &str) -> bool {
    name.starts_with("libc.so")
        || name.starts_with("libc-")
        || name.starts_with("libc.musl")
        || name.starts_with("ld-musl")
}

/// A function of an object: where its code starts in the file and the
/// bytes of its first instructions.
pub struct Function {
    pub file_offset: u64,
    pub code: Vec<u8>,
}

/// An object file's functions by name (dynamic and static symbols).
pub struct Symbols {
    data: Vec<u8>,
}

impl Symbols {
    /// The functions of an object memtrace holds itself (its shim).
    pub fn from_bytes(data: Vec<u8>) -> Symbols {
        Symbols { data }
    }

    pub fn open(path: &Path) -> Result<Symbols> {
        let data = crate::process::maps::read_object(path)
            .map_err(|e| Error::Usage(format!("cannot read {}: {e}", path.display())))?;
        Self::parse(data)
            .map_err(|e| Error::Usage(format!("{}: not an ELF object ({e})", path.display())))
    }

    /// The object in `data` (an error naming what is wrong with it).
    pub fn parse(data: Vec<u8>) -> std::result::Result<Symbols, object::Error> {
        object::File::parse(&*data)?;
        Ok(Symbols { data })
    }

    /// The function `name`, or None when the object has no such defined
    /// function.
    pub fn function(&self, name: &str) -> Option<Function> {
        let file = object::File::parse(&*self.data).ok()?;
        let sym = file
            .dynamic_symbols()
            .chain(file.symbols())
            .find(|s| s.is_definition() && s.name() == Ok(name) && s.address() != 0)?;
        let section = file.section_by_index(sym.section_index()?).ok()?;
        let (sec_off, sec_len) = section.file_range()?;
        let rel = sym.address().checked_sub(section.address())?;
        if rel >= sec_len {
            return None;
        }
        let start = (sec_off + rel) as usize;
        let len = (sym.size().max(16) as usize).min(64);
        let end = (start + len).min((sec_off + sec_len) as usize);
        Some(Function {
            file_offset: sec_off + rel,
            code: self.data.get(start..end)?.to_vec(),
        })
    }
}

/// Where to put a probe in a function: bytes after its entry, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub offset: u64,
    /// The probed instruction is emulated by the kernel (cheap), not
    /// single-stepped.
    pub emulated: bool,
}

/// Instructions looked at past the entry: prologues are short.
const LOOKAHEAD: usize = 6;

/// Chooses the cheapest probe point among `code`'s first instructions.
/// `args` are the argument registers the probe program reads; with
/// `keeps_sp`, the stack pointer must still point at the return address
/// (a return probe shares the point).
pub fn placement(code: &[u8], args: &[Register], keeps_sp: bool) -> Placement {
    let entry = Placement {
        offset: 0,
        emulated: false,
    };
    // The code is decoded as x86-64's; elsewhere (arm64) the probe stays at
    // the entry.
    if !cfg!(target_arch = "x86_64") {
        return entry;
    }
    let mut dec = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut ins = Instruction::default();
    for _ in 0..LOOKAHEAD {
        if !dec.can_decode() {
            break;
        }
        dec.decode_out(&mut ins);
        if ins.is_invalid() {
            break;
        }
        if emulated(&ins) {
            return Placement {
                offset: ins.ip(),
                emulated: true,
            };
        }
        if ins.flow_control() != FlowControl::Next {
            break;
        }
        let clobbers = info.info(&ins).used_registers().iter().any(|u| {
            let r = u.register().full_register();
            let writes = !matches!(
                u.access(),
                OpAccess::Read | OpAccess::CondRead | OpAccess::NoMemAccess
            );
            writes && (args.contains(&r) || (keeps_sp && r == Register::RSP))
        });
        if clobbers {
            break;
        }
    }
    entry
}

/// What x86-64 kernels emulate instead of single-stepping
/// (`arch/x86/kernel/uprobes.c`: `branch_setup_xol_ops`,
/// `push_setup_xol_ops`).
fn emulated(ins: &Instruction) -> bool {
    match ins.code() {
        Code::Push_r64 => true,
        Code::Nopd | Code::Nopw | Code::Nopq => ins.len() == 1,
        Code::Jmp_rel8_64 | Code::Jmp_rel32_64 | Code::Call_rel32_64 => true,
        _ => ins.flow_control() == FlowControl::ConditionalBranch && ins.is_jcc_short_or_near(),
    }
}

/// Whether `path` is an ELF executable without an interpreter (static).
pub fn is_static(path: &Path) -> bool {
    matches!(interpreter(path), Interp::Static)
}

/// Whether the opened executable `f` is static (a handle kept on a
/// process's file, read after it exited).
pub fn is_static_file(f: &std::fs::File) -> bool {
    f.try_clone()
        .and_then(crate::process::maps::read_file)
        .is_ok_and(|d| matches!(interp_of(&d), Interp::Static))
}

/// How an ELF executable is loaded.
pub enum Interp {
    Static,
    Other(String),
    NotElf,
}

/// Whether `path` is static, has an interpreter (which), or is no ELF file.
pub fn interpreter(path: &Path) -> Interp {
    let Ok(data) = crate::process::maps::read_object(path) else {
        return Interp::NotElf;
    };
    interp_of(&data)
}

fn interp_of(data: &[u8]) -> Interp {
    use object::read::elf::{ElfFile64, ProgramHeader as _};
    let Ok(elf) = ElfFile64::<object::Endianness>::parse(data) else {
        return Interp::NotElf;
    };
    let e = elf.endian();
    for ph in elf.elf_program_headers() {
        if ph.p_type(e) == object::elf::PT_INTERP {
            let name = ph.data(e, data).unwrap_or_default();
            let name = name.split(|&b| b == 0).next().unwrap_or_default();
            return Interp::Other(String::from_utf8_lossy(name).into_owned());
        }
    }
    Interp::Static
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARG0: &[Register] = &[Register::RDI];

    #[test]
    fn a_push_at_the_entry_is_probed_there() {
        // glibc 2.36 malloc: push %r12; push %rbp; mov %rdi,%rbp
        let code = [0x41, 0x54, 0x55, 0x48, 0x89, 0xfd];
        assert_eq!(
            placement(&code, ARG0, true),
            Placement {
                offset: 0,
                emulated: true
            }
        );
    }

    #[test]
    fn a_test_at_the_entry_moves_the_probe_to_the_jump_after_it() {
        // glibc 2.36 free: test %rdi,%rdi; je +0x..; push %rbp
        let code = [0x48, 0x85, 0xff, 0x0f, 0x84, 0x97, 0x00, 0x00, 0x00, 0x55];
        assert_eq!(
            placement(&code, ARG0, false),
            Placement {
                offset: 3,
                emulated: true
            }
        );
    }

    #[test]
    fn an_instruction_that_overwrites_an_argument_keeps_the_probe_at_the_entry() {
        // mov $0,%edi; push %rbp: the push no longer sees the argument.
        let code = [0xbf, 0x00, 0x00, 0x00, 0x00, 0x55];
        assert_eq!(placement(&code, ARG0, false).offset, 0);
        assert!(!placement(&code, ARG0, false).emulated);
    }

    #[test]
    fn a_return_probe_stays_where_the_stack_pointer_is_untouched() {
        // sub $8,%rsp; push %rbp
        let code = [0x48, 0x83, 0xec, 0x08, 0x55];
        assert_eq!(placement(&code, ARG0, true).offset, 0);
        // Without a return probe the push is fine.
        assert_eq!(placement(&code, ARG0, false).offset, 4);
    }

    #[test]
    fn endbr64_is_stepped_over() {
        // endbr64; push %rbp
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0x55];
        assert_eq!(placement(&code, ARG0, true).offset, 4);
    }

    #[test]
    fn the_libc_of_this_process_is_found() {
        let l = mapped_library(None, is_libc).expect("memtrace links libc");
        let syms = Symbols::open(&l.path).unwrap();
        let f = syms.function("malloc").expect("libc has malloc");
        assert!(f.file_offset > 0 && !f.code.is_empty());
        assert!(syms.function("no_such_function_here").is_none());
    }
}
