//! Loading the embedded object: globals and map sizes set by the tool,
//! every other on-demand map shrunk, aya kept from parsing kernel BTF.

use aya::{Ebpf, EbpfLoader, Pod};
use memtrace_common::names::{GlobalName, MapName, Prog, Sizing, ALL_MAPS};

use crate::error::{Error, Result};

/// The compiled kernel programs, embedded at build time.
static FULL: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memtrace.obj"));

/// The same programs for kernels without bpf_loop (before 5.17: 5.10 and
/// 5.15 LTS): none reaches bpf_loop, bpf_find_vma, bpf_task_pt_regs or
/// bpf_get_current_task_btf, and user stacks are the kernel's
/// frame-pointer walk. A 5.10 verifier refuses any program that merely
/// holds a bpf_loop callback, so these are a build of their own.
static COMPAT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memtrace-compat.obj"));

/// Whether this kernel gets the compat object: it has no bpf_loop (or
/// `MEMTRACE_OBJECT=compat` asks for it).
pub fn compat() -> bool {
    !crate::kernel::feature::bpf_loop()
}

/// The object for this kernel.
pub(crate) fn object() -> &'static [u8] {
    if compat() {
        COMPAT
    } else {
        FULL
    }
}

/// Globals and map sizes to apply when the object is loaded.
#[derive(Default, Clone)]
pub struct Loader {
    globals: Vec<(&'static str, Vec<u8>)>,
    sizes: Vec<(&'static str, u32)>,
    ruled_out: Vec<(&'static str, String)>,
}

impl Loader {
    pub fn global<T: Pod>(&mut self, g: GlobalName<T>, v: &T) -> &mut Self {
        // SAFETY: T is Pod: any byte pattern of it may be read.
        let bytes = unsafe {
            std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>())
        };
        self.globals.retain(|(n, _)| *n != g.name);
        self.globals.push((g.name, bytes.to_vec()));
        self
    }

    /// The names of the globals set so far.
    pub fn global_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.globals.iter().map(|(n, _)| *n)
    }

    /// The size set for `map`, if any.
    pub fn size_of<K, V>(&self, map: MapName<K, V>) -> Option<u32> {
        self.sizes
            .iter()
            .find(|(m, _)| *m == map.name)
            .map(|(_, n)| *n)
    }

    pub fn max_entries<K, V>(&mut self, map: MapName<K, V>, n: u32) -> &mut Self {
        self.sizes.retain(|(m, _)| *m != map.name);
        self.sizes.push((map.name, n));
        self
    }

    /// Program `prog` cannot run here (offsets it reads are missing from
    /// kernel BTF): the attach engine skips every way that uses it, saying why.
    pub fn rule_out(&mut self, prog: Prog, why: impl Into<String>) -> &mut Self {
        self.ruled_out.push((prog.0, why.into()));
        self
    }

    pub(crate) fn ruled_out(&self) -> &[(&'static str, String)] {
        &self.ruled_out
    }

    /// Loads the object with these globals and sizes.
    pub(crate) fn load(&self) -> Result<Ebpf> {
        raise_memlock();
        let mut loader = loader_without_kernel_btf();
        // Unused maps cost locked kernel memory; keep them tiny unless asked for.
        for (m, sizing) in ALL_MAPS.iter().copied().flatten() {
            if *sizing == Sizing::OnDemand && !self.sizes.iter().any(|(n, _)| n == m) {
                loader.map_max_entries(m, 1);
            }
        }
        for (m, n) in &self.sizes {
            loader.map_max_entries(m, *n);
        }
        for (name, bytes) in &self.globals {
            loader.override_global(name, bytes.as_slice(), true);
        }
        loader
            .load(object())
            .map_err(|e| Error::Load(super::chain(&e)))
    }
}

/// aya's `EbpfLoader::new` parses all of vmlinux BTF (a third of start-up
/// time and most of the peak memory), though memtrace resolves its offsets
/// itself and needs kernel BTF only for tp_btf and fentry (parsed then, in
/// `Session::btf`). So the loader is made in a thread whose own mount
/// namespace hides `/sys/kernel/btf`. Where that is not allowed, it pays.
fn loader_without_kernel_btf() -> EbpfLoader<'static> {
    std::thread::spawn(|| {
        if let Err(e) = hide_kernel_btf() {
            if std::env::var_os("MEMTRACE_TIMING").is_some() {
                say!("memtrace: timing: kernel BTF not hidden from aya: {e}");
            }
        }
        EbpfLoader::new()
    })
    .join()
    .unwrap_or_else(|_| EbpfLoader::new())
}

/// Only the calling thread changes namespace; the host's mounts are untouched.
fn hide_kernel_btf() -> std::io::Result<()> {
    let check = |r: libc::c_int| {
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: plain syscalls on constant C strings.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS))?;
        // Private first: otherwise the mount below would propagate back.
        check(libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ))?;
        check(libc::mount(
            c"none".as_ptr(),
            c"/sys/kernel/btf".as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_RDONLY,
            std::ptr::null(),
        ))
    }
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; newer ones use
/// the memory cgroup, so failing to raise it is only worth a note with -v.
fn raise_memlock() {
    let lim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid pointer.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use memtrace_common::names::{ALL_GLOBALS, ALL_MAPS, ALL_PROGS};
    use object::{Object, ObjectSection, ObjectSymbol, SectionKind, SymbolKind};

    use super::{COMPAT, FULL};

    /// Names of the object's maps, programs and globals, from its symbols.
    fn object_names(obj: &[u8]) -> (BTreeSet<String>, BTreeSet<String>, BTreeSet<String>) {
        let f = object::File::parse(obj).expect("the embedded eBPF object parses");
        let (mut maps, mut progs, mut globals) = Default::default();
        for sym in f.symbols() {
            let (Ok(name), Some(idx)) = (sym.name(), sym.section_index()) else {
                continue;
            };
            let Ok(sec) = f.section_by_index(idx) else {
                continue;
            };
            let sec_name = sec.name().unwrap_or_default();
            let set: &mut BTreeSet<String> = match sec_name {
                "maps" | ".maps" => &mut maps,
                s if s.starts_with(".rodata")
                    || s.starts_with(".bss")
                    || s.starts_with(".data") =>
                {
                    // Only named variables: the compiler's own constants are local.
                    if sym.kind() != SymbolKind::Data || !sym.is_global() {
                        continue;
                    }
                    &mut globals
                }
                // Programs: global functions outside .text (helpers live there).
                s if sec.kind() == SectionKind::Text && s != ".text" => {
                    if sym.kind() != SymbolKind::Text || !sym.is_global() {
                        continue;
                    }
                    &mut progs
                }
                _ => continue,
            };
            set.insert(name.to_string());
        }
        (maps, progs, globals)
    }

    #[test]
    fn every_name_is_in_the_object_and_every_object_name_is_named() {
        let maps: Vec<&str> = ALL_MAPS.iter().copied().flatten().map(|m| m.0).collect();
        let progs: Vec<&str> = ALL_PROGS.iter().copied().flatten().map(|p| p.0).collect();
        let globals: Vec<&str> = ALL_GLOBALS.iter().copied().flatten().copied().collect();
        let set = |v: &[&str]| -> BTreeSet<String> { v.iter().map(|n| n.to_string()).collect() };
        let (named_maps, named_progs, named_globals) = (set(&maps), set(&progs), set(&globals));
        // Each declared by one module only.
        assert_eq!(
            named_maps.len(),
            maps.len(),
            "a map is named twice: {maps:?}"
        );
        assert_eq!(named_progs.len(), progs.len(), "a program is named twice");
        assert_eq!(
            named_globals.len(),
            globals.len(),
            "a global is named twice"
        );
        // Both objects, both ways: a name here that an object lacks would
        // fail at run time; a map there that is not named here would keep
        // its compiled size in every tool.
        for (which, obj) in [("full", FULL), ("compat", COMPAT)] {
            let (maps, progs, globals) = object_names(obj);
            assert_eq!(maps, named_maps, "{which} maps: object vs names");
            assert_eq!(progs, named_progs, "{which} programs: object vs names");
            assert_eq!(globals, named_globals, "{which} globals: object vs names");
        }
    }

    /// Nothing in the compat object calls a helper 5.10 lacks, nor holds a
    /// callback (which a 5.10 verifier refuses on sight): no code, programs
    /// and the functions they call alike, calls bpf_loop (181),
    /// bpf_find_vma (180), bpf_task_pt_regs (175) or
    /// bpf_get_current_task_btf (158), or loads a function's address
    /// (ld_imm64 with src_reg 4). The full object does (the test's check).
    #[test]
    fn the_compat_object_calls_nothing_5_10_lacks() {
        let text = |obj| {
            let f = object::File::parse(obj).unwrap();
            f.sections()
                .filter(|s| s.kind() == SectionKind::Text)
                .map(|s| (s.name().unwrap().to_string(), s.data().unwrap().to_vec()))
                .collect::<Vec<_>>()
        };
        let calls_loop = |secs: &[(String, Vec<u8>)]| {
            secs.iter().any(|(_, code)| {
                code.chunks_exact(8)
                    .any(|i| i[0] == 0x85 && i[1] >> 4 == 0 && i[4..8] == 181i32.to_le_bytes())
            })
        };
        assert!(
            calls_loop(&text(FULL)),
            "the full object has no bpf_loop call"
        );
        let progs = text(COMPAT);
        assert!(progs.len() > 10, "{} text sections", progs.len());
        for (name, code) in &progs {
            for insn in code.chunks_exact(8) {
                let (op, regs) = (insn[0], insn[1]);
                let imm = i32::from_le_bytes(insn[4..8].try_into().unwrap());
                // BPF_JMP | BPF_CALL with src_reg 0: a helper call.
                if op == 0x85 && regs >> 4 == 0 {
                    assert!(
                        ![181, 180, 175, 158].contains(&imm),
                        "{name} calls helper {imm}"
                    );
                }
                assert!(
                    !(op == 0x18 && regs >> 4 == 4),
                    "{name} loads a function address"
                );
            }
        }
    }
}
