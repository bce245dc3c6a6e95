//! Heap probe points: the allocator functions of the object a process maps
//! (each at its cheapest instruction), anonymous mmaps, or the kernel's
//! allocator tracepoints.

use iced_x86::Register;
use memtrace_common::{
    memleak::{shape, MemleakConfig},
    names::{
        ML_ALLOC_ENTER, ML_ALLOC_RETURN, ML_ALLOC_SESSION, ML_CACHE_ALLOC, ML_CACHE_FREE,
        ML_ENTER_BY_SHAPE, ML_EXEC, ML_FREE, ML_KFREE, ML_KMALLOC, ML_MMAP_ENTER, ML_MMAP_EXIT,
        ML_MUNMAP, ML_PAGE_ALLOC, ML_PAGE_FREE, ML_PCPU_ALLOC, ML_PCPU_FREE,
    },
};

use std::path::Path;

use super::entries::{args_read, ALLOCATORS, CXX_DELETE, CXX_NEW, JE_ALLOC, JE_FREE};
use crate::error::{Error, Result};
use crate::kernel::Format;
use crate::session::attach::{Method, Probe};
use crate::session::uprobe::{
    is_libc, is_static, mapped_libraries, mapped_library, placement, Library, Placement, Symbols,
};

/// Which allocator is probed, for which processes, and how.
#[derive(Clone, Copy, Default)]
pub struct Points<'a> {
    /// The allocator's object, named (`-O`).
    pub object: Option<&'a Path>,
    /// Its functions' prefix (jemalloc's `je_`, mimalloc's `mi_`).
    pub prefix: &'a str,
    /// A running process whose mappings choose the object (`-p`'s).
    pub running: Option<u32>,
    /// A command not started yet, whose program may be static (`-c`'s).
    pub program: Option<&'a str>,
    /// The one process the breakpoints are for; None: every process that
    /// maps the object (the kernel programs keep the traced ones).
    pub only: Option<u32>,
    /// By a uprobe session or uprobe_multi link where the kernel has them.
    pub session: bool,
    /// Every function at its first instruction (to measure the placement).
    pub at_entry: bool,
}

/// Where the allocator is.
enum Object {
    /// `-O`, libc, or an allocator library the process maps: its C++
    /// operators are probed where it defines them (not libc's, which call
    /// malloc).
    Library(Library, Symbols),
    /// A static executable's own allocator (its operator new, libstdc++'s,
    /// calls malloc: not probed).
    Static(Library, Symbols),
    /// A static executable without a malloc symbol (stripped): named.
    Stripped(String),
    /// A Go program: its allocator calls no malloc.
    Go(String),
}

/// The target's executable when it is statically linked: -p's, or a simple
/// -c command's program (read before it starts).
fn static_executable(p: &Points) -> Option<Library> {
    let lib = match (p.running, p.program) {
        (Some(pid), _) => {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
            Library {
                path: format!("/proc/{pid}/exe").into(),
                shown: exe.display().to_string(),
            }
        }
        (None, Some(cmd)) if crate::process::command::is_simple(cmd) => {
            let path = crate::process::command::program_path(cmd.split_whitespace().next()?)?;
            Library {
                shown: path.display().to_string(),
                path,
            }
        }
        _ => return None,
    };
    is_static(&lib.path).then_some(lib)
}

/// The inode of the static executable whose own allocator is probed, if
/// one is.
pub fn static_inode(p: &Points) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let lib = static_executable(p)?;
    std::fs::metadata(&lib.path).ok().map(|m| m.ino())
}

/// The allocator's object and its symbols: `-O`, a static executable's
/// own, or the libc the process maps (for a `-c` command not started yet,
/// the one memtrace maps: the same file).
fn object(a: &Points) -> Result<Object> {
    if let Some(p) = a.object {
        let lib = Library {
            path: p.to_path_buf(),
            shown: p.display().to_string(),
        };
        let syms = Symbols::open(&lib.path)?;
        return Ok(Object::Library(lib, syms));
    }
    if let Some(lib) = static_executable(a) {
        let syms = Symbols::open(&lib.path)?;
        if syms.function(&format!("{}malloc", a.prefix)).is_none() {
            let go = std::fs::File::open(&lib.path)
                .is_ok_and(|f| crate::process::goheap::is_go_file(&f));
            return Ok(match go {
                true => Object::Go(lib.shown),
                false => Object::Stripped(lib.shown),
            });
        }
        say!(
            "memtrace: {} is statically linked: probing its own allocator",
            lib.shown
        );
        return Ok(Object::Static(lib, syms));
    }
    let pid = a.running;
    // A program linked with another allocator calls its malloc, not libc's
    // (redis-server and jemalloc): probing libc would see next to nothing.
    // The first that defines malloc (a program named "...alloc..." is not
    // one).
    let name = format!("{}malloc", a.prefix);
    let candidates = pid.map_or_else(Vec::new, |p| mapped_libraries(Some(p), is_other_allocator));
    for lib in candidates {
        if let Some(syms) = Symbols::open(&lib.path)
            .ok()
            .filter(|s| s.function(&name).is_some())
        {
            say!(
                "memtrace: process {} maps {}, whose malloc it calls: probing that (-O chooses another object)",
                pid.unwrap_or(0),
                lib.shown
            );
            return Ok(Object::Library(lib, syms));
        }
    }
    let lib = mapped_library(pid, is_libc).ok_or_else(|| {
        Error::Usage(format!(
            "no C library mapped by process {}: name the allocator's object with -O PATH",
            a.running.or(a.only).unwrap_or(0)
        ))
    })?;
    let syms = Symbols::open(&lib.path)?;
    Ok(Object::Library(lib, syms))
}

/// The file name of an allocator library that maps arenas of its own
/// (jemalloc, tcmalloc...: not a C library, nor a static program, whose
/// every stack is in its own image), as stack frames name its module.
pub fn arena_name(object: &str) -> Option<String> {
    let name = object.rsplit('/').next()?;
    (is_other_allocator(name) && name.contains(".so")).then(|| name.to_string())
}

/// Libraries that may be an allocator a program links instead of its C
/// library's malloc (jemalloc, tcmalloc, mimalloc, snmalloc, Hoard...):
/// the ones that define `malloc` are.
fn is_other_allocator(name: &str) -> bool {
    !is_libc(name) && (name.contains("alloc") || name.starts_with("libhoard"))
}

/// What probes a process's heap.
pub struct Probed {
    pub probes: Vec<Probe>,
    /// The object whose allocator is probed, as the process names it (None:
    /// anonymous mmaps only).
    pub object: Option<String>,
    /// The placements chosen and what is not traced, in words.
    pub said: Vec<String>,
}

/// Probes for a process's allocator (`mmap_probes` add its anonymous mmaps).
pub fn user(a: &Points) -> Result<Probed> {
    let (lib, syms, cxx_ok) = match object(a)? {
        Object::Library(lib, syms) => (lib, syms, true),
        Object::Static(lib, syms) => (lib, syms, false),
        Object::Go(exe) => {
            let said = vec![format!(
                "{exe}: a Go program: the Go heap from its runtime's profile, and its mmaps"
            )];
            return Ok(Probed {
                probes: Vec::new(),
                object: None,
                said,
            });
        }
        Object::Stripped(exe) => {
            say!(
                "memtrace: memleak: warning: {exe} is statically linked and stripped (no malloc \
                 symbol): its heap cannot be seen; only its anonymous mmaps are traced"
            );
            let said = vec![format!("{exe}: static and stripped: anonymous mmaps only")];
            return Ok(Probed {
                probes: Vec::new(),
                object: None,
                said,
            });
        }
    };
    let pid = a.only;
    let path = lib.path.to_string_lossy().into_owned();
    let mut probes = Vec::new();
    let mut said = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut points = Vec::new();
    let prefix = a.prefix;
    let cxx: Vec<(String, u64)> = CXX_NEW
        .iter()
        .filter(|_| cxx_ok && !is_libc(&lib.shown))
        .filter(|f| syms.function(f).is_some())
        .map(|f| (f.to_string(), shape::SIZE))
        .collect();
    // Not libc's: it has none, and a symbol prefix names jemalloc's own.
    let je: Vec<(String, u64)> = JE_ALLOC
        .iter()
        .map(|&(f, sh)| (format!("{prefix}{f}"), sh))
        .filter(|(f, _)| !is_libc(&lib.shown) && syms.function(f).is_some())
        .collect();
    if !je.is_empty() && syms.function(&format!("{prefix}xallocx")).is_some() {
        said.push(format!(
            "{prefix}xallocx: in-place resizes not traced (a resized block keeps its size)"
        ));
    }
    let c = ALLOCATORS
        .iter()
        .map(|&(f, sh)| (format!("{prefix}{f}"), sh));
    for (name, sh) in c.chain(cxx.iter().cloned()).chain(je.iter().cloned()) {
        let Some(func) = syms.function(&name) else {
            if name == format!("{prefix}malloc") {
                return Err(Error::Usage(format!(
                    "{}: no function {name} (is it the allocator? -O and --symbol-prefix choose)",
                    lib.shown
                )));
            }
            said.push(format!("{name}: not in {}, not traced", lib.shown));
            continue;
        };
        // Aliases (memalign and aligned_alloc in glibc) share code: one
        // probe, or each call would be seen twice.
        if !seen.insert(func.file_offset) {
            continue;
        }
        let at = place(a, &func.code, args_read(sh), true);
        said.push(describe(&name, at.offset, at.emulated));
        points.push((func.file_offset + at.offset, sh));
    }
    // A session skips the return of calls it does not record (sampling,
    // size bounds, calls inside another): one trap instead of two.
    let session = a.session.then_some(ML_ALLOC_SESSION);
    probes.push(Probe::new("allocator calls and returns").uprobe_session(
        session,
        (ML_ALLOC_ENTER, ML_ALLOC_RETURN, ML_ENTER_BY_SHAPE),
        path.clone(),
        points,
        pid,
    ));
    let free = format!("{prefix}free");
    let func = syms
        .function(&free)
        .ok_or_else(|| Error::Usage(format!("{}: no function {free}", lib.shown)))?;
    let at = place(a, &func.code, &[Register::RDI], false);
    said.push(describe(&free, at.offset, at.emulated));
    // Every free of the object by one link: one detach at the end, where a
    // uprobe each waited for grace periods each.
    let mut frees = vec![(func.file_offset + at.offset, 0)];
    let mut freed = std::collections::HashSet::from([func.file_offset]);
    let je_free = JE_FREE
        .iter()
        .filter(|_| !je.is_empty())
        .map(|f| format!("{prefix}{f}"));
    let cxx_delete = CXX_DELETE
        .iter()
        .filter(|_| !cxx.is_empty())
        .map(|f| f.to_string());
    for name in cxx_delete.chain(je_free) {
        let name = name.as_str();
        let Some(func) = syms.function(name) else {
            continue;
        };
        if !freed.insert(func.file_offset) {
            continue;
        }
        let at = place(a, &func.code, &[Register::RDI], false);
        said.push(describe(name, at.offset, at.emulated));
        frees.push((func.file_offset + at.offset, 0));
    }
    let mut p = Probe::new(format!("{free} and the other frees")).uprobe_multi(
        ML_FREE,
        path.clone(),
        frees,
        pid,
    );
    if !a.session {
        p.ways.retain(|w| w.method == Method::Uprobe);
    }
    probes.push(p);
    said.insert(0, format!("allocator in {}", lib.shown));
    Ok(Probed {
        probes,
        object: Some(lib.shown),
        said,
    })
}

/// Anonymous mmaps and munmaps, and execs.
pub fn mmap_probes(cfg: &mut MemleakConfig) -> Result<Vec<Probe>> {
    let mut probes = Vec::new();
    let enter = Format::load("syscalls", "sys_enter_mmap")?;
    cfg.mmap_len = enter.offset("len")?;
    cfg.mmap_flags = enter.offset("flags")?;
    cfg.sys_ret = Format::load("syscalls", "sys_exit_mmap")?.offset("ret")?;
    cfg.munmap_addr = Format::load("syscalls", "sys_enter_munmap")?.offset("addr")?;
    probes.push(Probe::new("anonymous mmap calls").tracepoint(
        ML_MMAP_ENTER,
        "syscalls",
        "sys_enter_mmap",
    ));
    probes.push(Probe::new("mmap returns").tracepoint(ML_MMAP_EXIT, "syscalls", "sys_exit_mmap"));
    probes.push(Probe::new("munmap calls").tracepoint(ML_MUNMAP, "syscalls", "sys_enter_munmap"));
    probes.push(execs());
    Ok(probes)
}

/// Execs of followed processes: the blocks of the image left behind are gone.
pub fn execs() -> Probe {
    Probe::new("execs").tracepoint(ML_EXEC, "sched", "sched_process_exec")
}

fn place(a: &Points, code: &[u8], args: &[Register], keeps_sp: bool) -> Placement {
    if a.at_entry {
        return Placement {
            offset: 0,
            emulated: false,
        };
    }
    placement(code, args, keeps_sp)
}

fn describe(name: &str, offset: u64, emulated: bool) -> String {
    match (offset, emulated) {
        (0, true) => format!("{name}: probed at its entry (instruction emulated)"),
        (o, true) => format!(
            "{name}: probed {o} bytes in, at the first instruction the kernel emulates \
             (the ones before it are single-stepped otherwise)"
        ),
        _ => format!("{name}: probed at its entry (instruction single-stepped: slower)"),
    }
}

/// The kernel's allocators, by the kmem and percpu tracepoints. Slab and
/// page allocations are required; percpu ones are traced where they exist.
pub fn kernel(cfg: &mut MemleakConfig) -> Result<Vec<Probe>> {
    let f = |n: &str| Format::load("kmem", n);
    let kmalloc = f("kmalloc")?;
    cfg.kmalloc_ptr = kmalloc.offset("ptr")?;
    cfg.kmalloc_bytes = kmalloc.offset("bytes_alloc")?;
    let cache = f("kmem_cache_alloc")?;
    cfg.cache_alloc_ptr = cache.offset("ptr")?;
    cfg.cache_alloc_bytes = cache.offset("bytes_alloc")?;
    cfg.kfree_ptr = f("kfree")?.offset("ptr")?;
    cfg.cache_free_ptr = f("kmem_cache_free")?.offset("ptr")?;
    let page = f("mm_page_alloc")?;
    cfg.page_alloc_pfn = page.offset("pfn")?;
    cfg.page_alloc_order = page.offset("order")?;
    cfg.page_free_pfn = f("mm_page_free")?.offset("pfn")?;
    let tp = |what: &str, prog, cat: &str, name: &str| {
        Probe::new(what.to_string()).tracepoint(prog, cat.to_string(), name.to_string())
    };
    let mut probes = vec![
        tp("kmalloc", ML_KMALLOC, "kmem", "kmalloc"),
        tp(
            "kmem_cache_alloc",
            ML_CACHE_ALLOC,
            "kmem",
            "kmem_cache_alloc",
        ),
        tp("kfree", ML_KFREE, "kmem", "kfree"),
        tp("kmem_cache_free", ML_CACHE_FREE, "kmem", "kmem_cache_free"),
        tp("page allocations", ML_PAGE_ALLOC, "kmem", "mm_page_alloc"),
        tp("page frees", ML_PAGE_FREE, "kmem", "mm_page_free"),
    ];
    let pcpu = Format::load("percpu", "percpu_alloc_percpu")
        .and_then(|a| Ok((a.offset("ptr")?, a.offset("bytes_alloc")?)))
        .and_then(|(p, b)| {
            Ok((
                p,
                b,
                Format::load("percpu", "percpu_free_percpu")?.offset("ptr")?,
            ))
        });
    match pcpu {
        Ok((p, b, fp)) => {
            (cfg.pcpu_alloc_ptr, cfg.pcpu_alloc_bytes, cfg.pcpu_free_ptr) = (p, b, fp);
            probes.push(
                tp(
                    "percpu allocations",
                    ML_PCPU_ALLOC,
                    "percpu",
                    "percpu_alloc_percpu",
                )
                .optional(),
            );
            probes
                .push(tp("percpu frees", ML_PCPU_FREE, "percpu", "percpu_free_percpu").optional());
        }
        Err(e) => say!("memtrace: warning: percpu allocations not traced: {e}"),
    }
    Ok(probes)
}
