//! Stack symbolization with blazesym. User addresses are normalized against a
//! cached copy of the process's maps, and the mapped files are kept open, so a
//! stack still symbolizes after its process has exited, and binaries inside
//! other mount namespaces are read through /proc/PID/root.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use blazesym::symbolize::{
    source::{Elf, Kernel, Source},
    Input, Symbolized, Symbolizer as Blaze,
};

use crate::output::frame::{FrameStyle, NOT_A_FILE};
use crate::output::Shown;
pub use crate::process::maps::{parse_maps, read_maps, Mapping};
use crate::process::proc::exiting;
use text::{describe, module_name};

struct Snapshot {
    /// Shared by a forked child and its parent until either reads its own.
    maps: Arc<Vec<Mapping>>,
    /// The images before its last execs, newest first: a stack taken before
    /// an exec is looked up in the image it was taken in.
    earlier: Vec<Arc<Vec<Mapping>>>,
}

/// Processes whose maps are kept before those that have exited are let go
/// (oldest first), and frames kept symbolized: bounds for long runs over
/// hosts that start thousands of processes.
const MAX_PROCS: usize = 4096;
const MAX_FRAMES: usize = 1 << 18;

/// Images kept per process from before its execs (a shell that execs a
/// wrapper that execs the program is two).
const GENERATIONS: usize = 4;

/// Maps of the processes seen, and open handles on their files.
#[derive(Default)]
pub struct MapsCache {
    procs: HashMap<u32, Snapshot>,
    /// (dev, inode) -> open file, so the path stays valid after exit.
    files: HashMap<((u32, u32), u64), Arc<File>>,
    /// Files held whether or not a kept process maps them (memtrace's own).
    held: HashSet<((u32, u32), u64)>,
    /// Processes let go since files were last closed.
    forgotten: usize,
    /// Processes to read again soon, and when: a process that just exec'd
    /// maps its libraries in its first milliseconds.
    pending: Vec<(u32, std::time::Instant)>,
    /// Pids in the order their maps were first kept.
    order: std::collections::VecDeque<u32>,
    /// In-kernel unwinding: each process's mappings are published to the
    /// programs as they are read.
    pub ktables: Option<crate::stacks::ktables::KTables>,
    /// The kernel programs report execs and executable mmaps
    /// (`crate::probes::exemaps`): an exec is handled from that record.
    pub learns: bool,
    /// Something looks up the maps of processes after they exit (user
    /// stacks, faults by mapping): else they go as the process does.
    pub keep_exited: bool,
    /// Run as a followed process stops at its exit, its memory still there
    /// (a tool's last read of it).
    pub exit_hooks: Vec<Box<dyn FnMut(u32) + Send>>,
}

impl MapsCache {
    /// Reads (again) the maps of `pid`; false if the process is gone.
    pub fn snapshot(&mut self, pid: u32) -> bool {
        // An exiting process loses its mappings while they are read, and then
        // shows none: keep the last whole copy rather than a torn one.
        if exiting(pid) {
            return false;
        }
        let Some(maps) = read_maps(pid).filter(|m| !m.is_empty()) else {
            return false;
        };
        if exiting(pid) {
            return false;
        }
        self.open_files(pid, &maps);
        // Before taking it out: a process read again keeps its place.
        self.keep(pid);
        // Unchanged (a parent read again at each fork): the copy kept, so
        // that the children it gave it to share one.
        if self.procs.get(&pid).is_some_and(|s| *s.maps == maps) {
            return true;
        }
        let earlier = self
            .procs
            .remove(&pid)
            .map(|s| s.earlier)
            .unwrap_or_default();
        if let Some(kt) = self.ktables.as_mut() {
            kt.update(pid, &maps, &self.files);
        }
        self.procs.insert(
            pid,
            Snapshot {
                maps: Arc::new(maps),
                earlier,
            },
        );
        true
    }

    /// Opens the executable files of `maps` (of process `pid`) not held yet.
    fn open_files(&mut self, pid: u32, maps: &[Mapping]) {
        for m in maps {
            if !m.perms.contains('x') || !m.path.starts_with('/') {
                continue;
            }
            let key = (m.dev, m.inode);
            if self.files.contains_key(&key) {
                continue;
            }
            // Through the process's root: right inside containers too.
            if let Ok(f) = m.open_in(pid) {
                let f = Arc::new(f);
                crate::stacks::buildid::saw(&m.path, &f);
                self.files.insert(key, f);
            }
        }
    }

    /// Reads again the maps of processes that ran code the in-kernel
    /// unwinder had no table for (a library loaded since).
    pub fn refresh_missed(&mut self) {
        let Some(pids) = self.ktables.as_mut().map(|kt| kt.missed()) else {
            return;
        };
        for p in pids {
            if let Some(kt) = self.ktables.as_mut() {
                kt.missed_start(p);
            }
            self.snapshot(p);
            if let Some(kt) = self.ktables.as_mut() {
                kt.missed_done(p);
            }
        }
    }

    /// A forked child: its image is its parent's until it execs. The
    /// parent's maps are read now (it may have mapped libraries since its
    /// last copy). A fork's record can be read after the child exec'd and
    /// got its own table (a `-c` child stops at its exec and its entry):
    /// a live child's maps are its own, the parent's kept as the image it
    /// left; only a child already gone takes its parent's.
    pub fn inherit(&mut self, parent: u32, child: u32) {
        self.snapshot(parent);
        let theirs = self.procs.get(&parent).map(|s| s.maps.clone());
        if self.snapshot(child) {
            if let Some(s) = self.procs.get_mut(&child) {
                s.earlier = match theirs {
                    Some(old) if *old != *s.maps => vec![old],
                    // Still its parent's image: one copy, shared.
                    Some(same) => {
                        s.maps = same;
                        Vec::new()
                    }
                    None => Vec::new(),
                };
            }
        } else if let Some(maps) = theirs {
            // Gone: nothing runs there any more, so no table to push.
            self.keep(child);
            self.procs.insert(
                child,
                Snapshot {
                    maps,
                    earlier: Vec::new(),
                },
            );
        }
    }

    /// A process that exec'd: the image it left kept aside, its maps now,
    /// and again a little later.
    pub fn exec(&mut self, pid: u32) {
        if let Some(kt) = self.ktables.as_mut() {
            kt.exec(pid);
        }
        let before = self.procs.get(&pid).map(|s| s.maps.clone());
        if self.snapshot(pid) {
            if let (Some(old), Some(s)) = (before, self.procs.get_mut(&pid)) {
                // Unless a periodic read already saw the new image and the
                // old one is gone from here.
                if *old != *s.maps {
                    s.earlier.insert(0, old);
                    s.earlier.truncate(GENERATIONS);
                }
            }
        }
        let now = std::time::Instant::now();
        for ms in [30, 300] {
            self.pending
                .push((pid, now + std::time::Duration::from_millis(ms)));
        }
    }

    /// Reads again the processes whose time has come (those still there).
    pub fn refresh_due(&mut self) {
        let now = std::time::Instant::now();
        let due: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, at)| *at <= now)
            .map(|(p, _)| *p)
            .collect();
        self.pending.retain(|(_, at)| *at > now);
        for p in due {
            self.snapshot(p);
        }
    }

    pub fn has(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }

    /// The open file behind mapping `m`, if it could be opened.
    pub fn file(&self, m: &Mapping) -> Option<Arc<File>> {
        self.files.get(&(m.dev, m.inode)).cloned()
    }

    pub fn maps(&self, pid: u32) -> Option<&[Mapping]> {
        self.procs.get(&pid).map(|s| s.maps.as_slice())
    }

    /// The path of file (`dev`, `inode`) in `pid`'s kept maps (its image
    /// now or before its execs), else in any process's kept here.
    pub fn path_of(&self, pid: u32, dev: (u32, u32), inode: u64) -> Option<Arc<str>> {
        let find = |s: &Snapshot| {
            std::iter::once(&s.maps)
                .chain(&s.earlier)
                .flat_map(|m| m.iter())
                .find(|m| m.dev == dev && m.inode == inode)
                .map(|m| m.path.clone())
        };
        self.procs
            .get(&pid)
            .and_then(find)
            .or_else(|| self.procs.values().find_map(find))
    }

    /// The file and file offset of `addr` in `pid`, with the file's open
    /// handle: in its image now, else in the images before its execs.
    fn locate(&self, pid: u32, addr: u64) -> Option<(&Mapping, u64, Option<Arc<File>>)> {
        let snap = self.procs.get(&pid)?;
        // Maps are sorted by address, as /proc gives them.
        let m = std::iter::once(&snap.maps)
            .chain(&snap.earlier)
            .find_map(|maps| {
                let i = maps.partition_point(|m| m.end <= addr);
                maps.get(i).filter(|m| m.start <= addr)
            })?;
        let file = self.files.get(&(m.dev, m.inode)).cloned();
        Some((m, addr - m.start + m.offset, file))
    }
}

pub type SharedMaps = Arc<Mutex<MapsCache>>;

impl crate::process::command::Images for MapsCache {
    fn exec(&mut self, pid: u32) {
        MapsCache::exec(self, pid)
    }
    fn snapshot(&mut self, pid: u32) -> bool {
        MapsCache::snapshot(self, pid)
    }
    fn exiting(&mut self, pid: u32) {
        MapsCache::snapshot(self, pid);
        for h in &mut self.exit_hooks {
            h(pid);
        }
    }
    fn unwinds_in_kernel(&self) -> bool {
        self.ktables.is_some()
    }
}

pub struct Symbolizer {
    pub style: FrameStyle,
    blaze: Blaze,
    pub maps: SharedMaps,
    /// By (device, inode, file offset): the processes of one program (a
    /// churning host starts thousands) share their frames' names. Nothing
    /// is kept by (pid, address): under churn every new process filled
    /// such a cache anew (47 MiB of a host-wide `faults --stacks`' 131
    /// MiB), and a pid that exec'd kept the names of its old image.
    by_file: HashMap<((u32, u32), u64, u64), Shown>,
    /// Each text once: many offsets of one function read the same (the
    /// interpreter loop of every Python frame), and rows hold them shared.
    texts: HashSet<Shown>,
    kcache: HashMap<u64, Shown>,
    symtabs: symtab::Symtabs,
    go: crate::stacks::gopclntab::GoTables,
    /// Python code objects read, for the Python frames of stacks.
    pub python: crate::stacks::python::PyCodes,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    pub fn new() -> Self {
        Symbolizer {
            style: FrameStyle::default(),
            blaze: Blaze::builder().enable_code_info(false).build(),
            maps: Arc::new(Mutex::new(MapsCache::default())),
            by_file: HashMap::new(),
            texts: HashSet::new(),
            kcache: HashMap::new(),
            symtabs: Default::default(),
            go: Default::default(),
            python: Default::default(),
        }
    }

    /// How frames are shown. Source lines need each file's line tables
    /// parsed, which names alone do not: kept out unless shown (or
    /// recorded), they were most of the 11 MB blazesym held in `faults
    /// --stacks` under churn.
    pub fn set_style(&mut self, style: FrameStyle) {
        self.style = style;
        self.blaze = Blaze::builder()
            .enable_code_info(style == FrameStyle::Lines)
            .build();
    }

    /// Where `pid`'s Python code and string types are, if it runs a
    /// CPython whose frames are walked.
    pub fn python_types(&self, pid: u32) -> Option<[u64; 2]> {
        let maps = self.maps.lock().unwrap();
        maps.ktables.as_ref()?.python.as_ref()?.types(pid)
    }

    /// Symbolizes user addresses of `pid`, innermost first.
    pub fn user(&mut self, pid: u32, addrs: &[u64]) -> Vec<Shown> {
        {
            let mut maps = self.maps.lock().unwrap();
            // Read the maps again if an address falls outside the copy (a
            // library mapped since, e.g. after an early snapshot at exec).
            if !maps.has(pid) || addrs.iter().any(|&a| maps.locate(pid, a).is_none()) {
                maps.snapshot(pid);
            }
        }
        addrs.iter().map(|&a| self.user_one(pid, a)).collect()
    }

    fn user_one(&mut self, pid: u32, addr: u64) -> Shown {
        let maps = self.maps.lock().unwrap();
        let s = match maps.locate(pid, addr) {
            None if !maps.has(pid) => format!("{addr:#x} [{}]", NOT_A_FILE[2]).into(),
            None => format!("{addr:#x} [{}]", NOT_A_FILE[0]).into(),
            Some((m, off, _)) if let Some(s) = self.by_file.get(&(m.dev, m.inode, off)) => {
                s.clone()
            }
            Some((m, off, file)) => {
                let module = module_name(&m.path).to_string();
                let path = match &file {
                    Some(f) => PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())),
                    None => m.file.to_path_buf(),
                };
                let mut elf = Elf::new(path);
                elf.debug_syms =
                    self.style == FrameStyle::Lines || !self.symtabs.has(m.dev, m.inode, &elf.path);
                let elf_path = elf.path.clone();
                let src = Source::Elf(elf);
                let s = match self.blaze.symbolize_single(&src, Input::FileOffset(off)) {
                    Ok(Symbolized::Sym(sym)) => describe(&sym, &module, self.style),
                    // A stripped Go binary: its runtime's own function table.
                    _ if let Some(n) = self.go.name_at(m.dev, m.inode, &elf_path, off) => {
                        format!("{n} [{module}]")
                    }
                    // No symbol: the offset in the file, as perf report
                    // shows it (the same in every run, for addr2line and
                    // for the stack's id); none when the code is no file's.
                    _ if module.is_empty() => format!("{addr:#x} [{}]", NOT_A_FILE[1]),
                    _ => format!("{off:#x} [{module}]"),
                };
                if m.inode == 0 {
                    return s.into();
                }
                if self.by_file.len() >= MAX_FRAMES {
                    self.by_file.clear();
                    self.texts.clear();
                    self.symtabs.clear();
                    self.go.clear();
                }
                let s = match self.texts.get(s.as_str()) {
                    Some(t) => t.clone(),
                    None => {
                        let t = Shown::from(s);
                        self.texts.insert(t.clone());
                        t
                    }
                };
                self.by_file.insert((m.dev, m.inode, off), s.clone());
                s
            }
        };
        drop(maps);
        s
    }

    /// Symbolizes kernel addresses from /proc/kallsyms, innermost first.
    pub fn kernel(&mut self, addrs: &[u64]) -> Vec<Shown> {
        let missing: Vec<u64> = addrs
            .iter()
            .copied()
            .filter(|a| !self.kcache.contains_key(a))
            .collect();
        if !missing.is_empty() {
            // kallsyms only: no vmlinux with DWARF on most hosts, and looking for one is slow.
            let k = Kernel {
                vmlinux: blazesym::MaybeDefault::None,
                kaslr_offset: Some(0),
                ..Default::default()
            };
            let src = Source::Kernel(k);
            let syms = self
                .blaze
                .symbolize(&src, Input::AbsAddr(&missing))
                .unwrap_or_default();
            for (i, a) in missing.iter().enumerate() {
                let s = match syms.get(i) {
                    Some(Symbolized::Sym(sym)) if self.style == FrameStyle::Addresses => {
                        format!("{}+{:#x}", sym.name, sym.offset)
                    }
                    Some(Symbolized::Sym(sym)) => sym.name.to_string(),
                    _ => format!("{a:#x}"),
                };
                self.kcache.insert(*a, s.into());
            }
        }
        addrs.iter().map(|a| self.kcache[a].clone()).collect()
    }
}

mod evict;
mod learned;
mod symtab;
pub mod text;

#[cfg(test)]
mod tests;
