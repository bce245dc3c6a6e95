//! CPython frames in user stacks. As each process's maps are read, the
//! file holding its interpreter (`_PyRuntime`, and `Py_Version` for the
//! layout) is found and published for the kernel program, which writes the
//! thread's Python frames after the native ones (`memtrace_common::python`).
//! Here a stack's Python frames are named from their code objects, read
//! from the process once each, and put in place of the native frames of
//! the eval loop that ran them: one `_PyEval_EvalFrameDefault` per C call
//! into Python.

pub mod code;
pub mod layout;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::sync::Arc;

use aya::maps::{HashMap as BpfHash, MapData};
use memtrace_common::{
    names,
    python::{frame, PyProc},
};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};

use crate::output::{Shown, Value};
use crate::process::maps::Mapping;
use code::Code;
use layout::{layout, Layout, FIRST_MINOR, LAST_MINOR};

type FileId = ((u32, u32), u64);

/// What a mapped file is to the Python walk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Runtime {
    /// CPython's runtime: `_PyRuntime` this far past the file's first
    /// byte as mapped, in a version memtrace walks; `types` the same for
    /// `PyCode_Type` and `PyUnicode_Type`, which a code object read and
    /// its strings must have.
    Walked {
        off: u64,
        minor: u32,
        types: [u64; 2],
    },
    /// A CPython memtrace does not walk, and why.
    Not(String),
    /// Not CPython's runtime.
    None,
}

/// Files remembered as CPython's or not.
const MAX_FILES: usize = 4096;

/// Whether the file named `name` is CPython's runtime, from its symbols.
pub fn classify<'d, R: object::ReadRef<'d>>(obj: &object::File<'d, R>) -> Runtime {
    // Exported, so in the dynamic symbols: the full symbol table of an
    // interpreter built with debug information is tens of MiB to read.
    let sym = |n: &str| obj.dynamic_symbols().find(|s| s.name() == Ok(n));
    let Some(rt) = sym("_PyRuntime") else {
        return Runtime::None;
    };
    let version = sym("Py_Version").and_then(|s| {
        let sec = obj.section_by_index(s.section_index()?).ok()?;
        let b = sec.data_range(s.address(), 4).ok()??;
        Some(u32::from_le_bytes(b.try_into().ok()?))
    });
    let minor = match version {
        Some(v) if v >> 24 == 3 => (v >> 16) & 0xff,
        Some(v) => return Runtime::Not(format!("Python {}: not CPython 3", v >> 24)),
        // Py_Version is from 3.11 on.
        None => {
            return Runtime::Not(format!(
                "CPython before 3.{FIRST_MINOR} (no Py_Version): its frames are not walked (3.{FIRST_MINOR} to 3.{LAST_MINOR} are)"
            ))
        }
    };
    if layout(minor).is_none() {
        return Runtime::Not(format!(
            "CPython 3.{minor}: its frames are not walked (3.{FIRST_MINOR} to 3.{LAST_MINOR} are)"
        ));
    }
    // Addresses are the file's; its first segment is where it is mapped.
    let Some(base) = obj
        .segments()
        .find(|s| s.file_range().0 == 0)
        .map(|s| s.address() & !0xfff)
    else {
        return Runtime::Not("no segment at its start".into());
    };
    let types = ["PyCode_Type", "PyUnicode_Type"].map(|n| {
        sym(n)
            .and_then(|s| s.address().checked_sub(base))
            .unwrap_or(0)
    });
    if types.contains(&0) {
        return Runtime::Not("no PyCode_Type or PyUnicode_Type symbol".into());
    }
    match rt.address().checked_sub(base) {
        Some(off) => Runtime::Walked { off, minor, types },
        None => Runtime::Not("_PyRuntime before its first segment".into()),
    }
}

fn classify_file(path: &str, f: &File) -> Runtime {
    let name = path.rsplit('/').next().unwrap_or(path);
    // Only files named as CPython's are parsed: most mapped files are not.
    if !(name.starts_with("python") || name.starts_with("libpython")) {
        return Runtime::None;
    }
    let cache = object::ReadCache::new(f);
    match object::File::parse(&cache) {
        Ok(obj) => classify(&obj),
        Err(_) => Runtime::None,
    }
}

/// Publishes, per process, where its interpreter is (`PY_PROCS`).
pub struct PyProcs {
    map: BpfHash<MapData, u32, PyProc>,
    files: HashMap<FileId, Runtime>,
    published: HashMap<u32, PyProc>,
    /// Per process, where `PyCode_Type` and `PyUnicode_Type` are.
    types: HashMap<u32, [u64; 2]>,
    said: HashSet<FileId>,
    verbose: bool,
    /// Processes whose interpreter was published.
    pub processes: u64,
}

impl PyProcs {
    /// None where the object has no Python map (the compat object).
    pub fn new(bpf: &mut aya::Ebpf, verbose: bool) -> Option<PyProcs> {
        let map = BpfHash::try_from(bpf.take_map(names::PY_PROCS.name)?).ok()?;
        Some(PyProcs {
            map,
            files: HashMap::new(),
            published: HashMap::new(),
            types: HashMap::new(),
            said: HashSet::new(),
            verbose,
            processes: 0,
        })
    }

    /// `pid`'s maps were read: its interpreter, if it runs one.
    pub fn update(&mut self, pid: u32, maps: &[Mapping], files: &HashMap<FileId, Arc<File>>) {
        let mut found = None;
        for m in maps
            .iter()
            .filter(|m| m.perms.contains('x') && m.inode != 0)
        {
            let id = (m.dev, m.inode);
            if self.files.len() >= MAX_FILES {
                self.files.clear();
            }
            let rt = self
                .files
                .entry(id)
                .or_insert_with(|| {
                    files
                        .get(&id)
                        .map_or(Runtime::None, |f| classify_file(&m.path, f))
                })
                .clone();
            match rt {
                Runtime::Walked { off, minor, types } => {
                    found = Some((id, off, minor, types));
                    break;
                }
                Runtime::Not(why) if self.said.insert(id) => {
                    say!("memtrace: python: {}: {why}", m.path);
                }
                _ => {}
            }
        }
        let Some((id, off, minor, types)) = found else {
            return;
        };
        let Some(m0) = maps
            .iter()
            .find(|m| (m.dev, m.inode) == id && m.offset == 0)
        else {
            return;
        };
        let Some(l) = layout(minor) else {
            return;
        };
        let p = l.proc(m0.start + off);
        self.types.insert(pid, types.map(|t| m0.start + t));
        if self.published.get(&pid) == Some(&p) {
            return;
        }
        match self.map.insert(pid, p, 0) {
            Ok(()) => {
                if self.published.insert(pid, p).is_none() {
                    self.processes += 1;
                }
            }
            Err(e) if self.verbose => say!("memtrace: python: process {pid}: {e}"),
            Err(_) => {}
        }
    }

    /// `pid` exec'd: the kernel program dropped its entry.
    pub fn exec(&mut self, pid: u32) {
        self.published.remove(&pid);
    }

    /// Where `pid`'s `PyCode_Type` and `PyUnicode_Type` are.
    pub fn types(&self, pid: u32) -> Option<[u64; 2]> {
        self.types.get(&pid).copied()
    }

    pub fn forget(&mut self, pid: u32) {
        self.types.remove(&pid);
        if self.published.remove(&pid).is_some() {
            let _ = self.map.remove(&pid);
        }
    }
}

/// A stack's Python frames, as the kernel program wrote them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    pub tgid: u32,
    pub minor: u32,
    pub frames: Vec<u64>,
}

/// A stack's native words and its Python section, if it has one.
pub fn split(ips: &[u64]) -> (&[u64], Option<Section>) {
    let Some(i) = ips.iter().position(|&w| frame::is_begin(w)) else {
        return (ips, None);
    };
    let b = ips[i];
    let frames = ips[i + 1..]
        .iter()
        .copied()
        .filter(|&w| frame::is_frame(w))
        .collect();
    let s = Section {
        tgid: b as u32,
        minor: ((b >> 32) & 0xff) as u32,
        frames,
    };
    (&ips[..i], Some(s))
}

/// Code objects kept, at most (past it they are read again).
const MAX_CODES: usize = 1 << 16;
/// Processes whose memory is kept open.
const MAX_OPEN: usize = 64;

/// Code objects read, by process and address.
#[derive(Default)]
pub struct PyCodes {
    codes: HashMap<(u32, u64), Option<Arc<Code>>>,
    mems: HashMap<u32, Option<File>>,
    /// Code objects that could not be read (their frames say so).
    pub unread: u64,
}

impl PyCodes {
    /// Reads the code objects of `s` not read yet, while its process is
    /// there to read them from.
    pub fn learn(&mut self, s: &Section, types: Option<[u64; 2]>) {
        let Some(l) = layout(s.minor) else {
            return;
        };
        for &w in &s.frames {
            let (code, _, _) = frame::decode(w);
            self.code(s.tgid, code, l, types);
        }
    }

    /// The code object at `at` in `pid`, read unless it was; one without
    /// the code type (freed since, and reused) is not believed.
    fn code(
        &mut self,
        pid: u32,
        at: u64,
        l: &Layout,
        types: Option<[u64; 2]>,
    ) -> Option<Arc<Code>> {
        if let Some(c) = self.codes.get(&(pid, at)) {
            return c.clone();
        }
        if self.codes.len() >= MAX_CODES {
            self.codes.clear();
        }
        if self.mems.len() >= MAX_OPEN && !self.mems.contains_key(&pid) {
            self.mems.clear();
        }
        let mem = self
            .mems
            .entry(pid)
            .or_insert_with(|| File::open(format!("/proc/{pid}/mem")).ok());
        let c = mem
            .as_ref()
            .zip(types)
            .and_then(|(m, t)| code::read_code(m, at, l, t).ok())
            .map(Arc::new);
        if c.is_none() {
            self.unread += 1;
        }
        self.codes.insert((pid, at), c.clone());
        c
    }

    /// The frames of `s`, innermost first, each with whether it is the
    /// outermost of its C call into the eval loop.
    pub fn frames(&mut self, s: &Section, types: Option<[u64; 2]>) -> Vec<(Shown, bool)> {
        let l = layout(s.minor);
        s.frames
            .iter()
            .map(|&w| {
                let (at, units, entry) = frame::decode(w);
                let c = l.and_then(|l| self.code(s.tgid, at, l, types));
                let text = match (c, l) {
                    (Some(c), Some(l)) => match c.line(units, l) {
                        Some(n) => format!("{} ({}:{n}) [python]", c.name, c.file),
                        None => format!("{} ({}) [python]", c.name, c.file),
                    },
                    _ => format!(
                        "[python code {at:#x}: freed or unreadable before memtrace read it]"
                    ),
                };
                (Shown::from(text), entry)
            })
            .collect()
    }

    /// A process is gone: its memory is not read again.
    pub fn exited(&mut self, pid: u32) {
        self.mems.remove(&pid);
    }
}

/// The native frames with each eval-loop frame replaced, in turn, by the
/// Python frames of its C call, innermost first. Python frames left over
/// (the native unwind ended before their calls) go after the native ones.
pub fn merge(native: Vec<Shown>, py: &[(Shown, bool)]) -> Vec<Shown> {
    let mut groups = py.split_inclusive(|(_, entry)| *entry);
    let mut out = Vec::with_capacity(native.len() + py.len());
    for f in native {
        if f.starts_with("_PyEval_EvalFrameDefault") {
            if let Some(g) = groups.next() {
                out.extend(g.iter().map(|(s, _)| s.clone()));
                continue;
            }
        }
        out.push(f);
    }
    for g in groups {
        out.extend(g.iter().map(|(s, _)| s.clone()));
    }
    out
}

/// The summary's Python figures: how each walk of a Python thread ended
/// (`PY_STATS`), the processes published and the code objects that could
/// not be read to name their frames.
pub fn summary(s: &crate::stacks::Traced, processes: u64) -> Vec<(&'static str, Value)> {
    let ends = s.read_percpu_array(names::PY_STATS).unwrap_or_default();
    let mut v: Vec<(&'static str, Value)> = memtrace_common::python::stat::NAMES
        .iter()
        .enumerate()
        .map(|(i, n)| {
            (
                *n,
                Value::from(ends.get(i).map_or(0, |c| c.iter().sum::<u64>())),
            )
        })
        .collect();
    v.push(("python_processes", Value::from(processes)));
    v.push(("python_code_unread", Value::from(s.sym.python.unread)));
    v
}

#[cfg(test)]
mod tests;
