//! The tables behind in-kernel DWARF unwinding: each file's rows compiled
//! once (`build`) into one shared array the programs read (written through a
//! memory mapping of it), and per process the slices its executable mappings
//! use, kept current as memtrace reads the process's maps (at start, fork,
//! exec, and when the program meets code it has no table for).

pub mod build;
mod cfi;
mod entries;
mod files;
mod genpage;
mod golang;
mod rows;
pub mod seed;
mod slice;

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aya::maps::{HashMap as BpfHash, Map, MapData};
use memtrace_common::kunwind::{
    UnwindFile, UnwindFileKey, UnwindMapping, UnwindProc, MAX_UNWIND_MAPPINGS,
};
use memtrace_common::names;

use crate::error::{Error, Result};
use crate::process::maps::Mapping;
use rows::Rows;
use slice::Rules;

pub type FileId = ((u32, u32), u64);

/// A file's rows in the shared array, or why it has none.
#[derive(Clone)]
enum Slice {
    Rows {
        /// The slice: `n` words from `first`, holding `rows` rows.
        first: u32,
        n: u32,
        rows: u32,
        segments: Arc<Vec<(u64, u64, u64)>>,
    },
    None(&'static str),
}

/// What the tables hold and what they left out, for the summary and `-v`.
#[derive(Debug, Default, Clone, Copy)]
pub struct TableStats {
    /// 4-byte words of the row array, and those in use.
    pub capacity_words: u64,
    pub words: u64,
    /// Rows in use, and the distinct rules they name.
    pub rows: u64,
    pub rules: u64,
    pub files: u64,
    /// Rows whose rule the table cannot express (an unwind stops there).
    pub rows_unsupported: u64,
    /// Files without `.eh_frame` (or unreadable).
    pub files_no_info: u64,
    /// Files left out because the table was full (`--unwind-table-size`).
    pub files_over_budget: u64,
    /// Executable mappings past the per-process limit.
    pub mappings_dropped: u64,
    /// Files with rows the by-identity map had no room for (their code is
    /// found through each process's table only).
    pub files_unshared: u64,
    /// Files whose rows went to make room (no live process's table held
    /// them).
    pub files_evicted: u64,
    pub build_ms: f64,
    /// Python processes whose interpreter was published (None: the
    /// object walks no Python frames).
    pub python_processes: Option<u64>,
}

pub struct KTables {
    rows: Rows,
    rules: Rules,
    /// Generation of the last process table published.
    gen: u32,
    files: HashMap<FileId, Slice>,
    procs: BpfHash<MapData, u32, UnwindProc>,
    /// `gen` for the kernel program: its memo of a stack holds until a
    /// table changes.
    gen_map: aya::maps::Array<MapData, u32>,
    /// The generation as the shim reads it, once a memo is served.
    shim_gen: Option<genpage::GenPage>,
    misses: BpfHash<MapData, u32, u8>,
    /// Files with rows by identity, for code in no process's table yet.
    by_file: BpfHash<MapData, UnwindFileKey, UnwindFile>,
    pushed: HashMap<u32, Vec<UnwindMapping>>,
    /// Files of the table being put together (`update`), kept from eviction.
    pinned: std::collections::HashSet<FileId>,
    refreshed: HashMap<u32, Instant>,
    verbose: bool,
    pub stats: TableStats,
    /// Where each Python process's interpreter is, for its frames.
    pub python: Option<crate::stacks::python::PyProcs>,
    /// Keep the arrays' maps (and so their mappings) alive.
    _rows_map: Map,
    _rules_map: Map,
}

/// Why a file that did not fit has no rows (tried again after an eviction).
const TABLE_FULL: &str = "the unwind table is full (--unwind-table-size)";

/// A file's identity as the kernel programs read it (`dev_t` is major << 20
/// | minor there).
fn file_key(((major, minor), ino): FileId) -> UnwindFileKey {
    UnwindFileKey {
        ino,
        dev: major << 20 | minor,
        _pad: 0,
    }
}

/// Bytes of locked kernel memory `words` rows (and headers) take.
pub fn table_bytes(words: u64) -> u64 {
    words * 4
}

/// Maps a BPF_F_MMAPABLE array shared and writable: (address, entries,
/// bytes mapped). Its entries are 8 bytes apart, whatever their size.
fn map_array(map: &Map, name: &str) -> Result<(*mut u64, u32, usize)> {
    let Map::Array(data) = map else {
        return Err(Error::Usage(format!("{name} is not an array")));
    };
    let len = data.info().map(|i| i.max_entries()).unwrap_or(0) as usize;
    let page = crate::kernel::btf::page_size() as usize;
    let bytes = (len * 8).div_ceil(page) * page;
    // SAFETY: a shared mapping of a BPF_F_MMAPABLE array of `len` entries.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            data.fd().as_fd().as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(Error::Io(std::io::Error::last_os_error()));
    }
    Ok((ptr.cast(), len as u32, bytes))
}

/// Lets go of each process's table as it exits (`unwind_exit`).
pub fn exit_probe() -> crate::session::attach::Probe {
    crate::session::attach::Probe::new("process exits (unwind tables)")
        .tracepoint(names::UNWIND_EXIT, "sched", "sched_process_exit")
        .optional()
}

/// How often a process whose code had no table has its maps read again.
const MISS_EVERY: Duration = Duration::from_millis(200);

impl KTables {
    /// Takes the unwind maps out of the loaded object (sized by
    /// `ustack::setup`) and maps the row array.
    pub fn new(bpf: &mut aya::Ebpf, verbose: bool) -> Result<KTables> {
        let take = |bpf: &mut aya::Ebpf, n: &str| {
            bpf.take_map(n)
                .ok_or_else(|| Error::Usage(format!("no map {n} in the eBPF object")))
        };
        let rows_map = take(bpf, names::UNWIND_ROWS.name)?;
        let procs = BpfHash::try_from(take(bpf, names::UNWIND_PROCS.name)?)
            .map_err(|e| Error::Usage(format!("UNWIND_PROCS: {e}")))?;
        let gen_map = aya::maps::Array::try_from(take(bpf, names::UNWIND_GEN.name)?)
            .map_err(|e| Error::Usage(format!("UNWIND_GEN: {e}")))?;
        let misses = BpfHash::try_from(take(bpf, names::UNWIND_MISSES.name)?)
            .map_err(|e| Error::Usage(format!("UNWIND_MISSES: {e}")))?;
        let by_file = BpfHash::try_from(take(bpf, names::UNWIND_FILES.name)?)
            .map_err(|e| Error::Usage(format!("UNWIND_FILES: {e}")))?;
        let rules_map = take(bpf, names::UNWIND_RULES.name)?;
        let Map::Array(data) = &rows_map else {
            return Err(Error::Usage("UNWIND_ROWS is not an array".into()));
        };
        let len = data.info().map(|i| i.max_entries()).unwrap_or(0);
        // Two words an entry; the map is kept open beside `rows`.
        let rows = Rows::new(data.fd().as_fd().as_raw_fd(), 2 * len);
        let (rptr, rlen, rbytes) = map_array(&rules_map, names::UNWIND_RULES.name)?;
        // SAFETY: as above; a new array is zeroed.
        let rules = unsafe { Rules::new(rptr, rlen, rbytes) };
        Ok(KTables {
            rows,
            rules,
            gen: 0,
            files: HashMap::new(),
            procs,
            gen_map,
            shim_gen: None,
            misses,
            by_file,
            pushed: HashMap::new(),
            pinned: Default::default(),
            refreshed: HashMap::new(),
            verbose,
            stats: TableStats {
                capacity_words: 2 * len as u64,
                ..Default::default()
            },
            python: crate::stacks::python::PyProcs::new(bpf, verbose),
            _rows_map: rows_map,
            _rules_map: rules_map,
        })
    }

    /// Publishes `pid`'s executable mappings, compiling the files not seen
    /// yet. `files` are the open handles MapsCache keeps.
    pub fn update(&mut self, pid: u32, maps: &[Mapping], files: &HashMap<FileId, Arc<File>>) {
        if let Some(py) = self.python.as_mut() {
            py.update(pid, maps, files);
            self.stats.python_processes = Some(py.processes);
        }
        let mut entries = Vec::new();
        // The files of this table are not in the kernel yet: an eviction
        // to place a later one must not take theirs.
        self.pinned.clear();
        // User addresses only ([vsyscall] is in the kernel's half): the
        // program's search compares them as signed numbers.
        for m in maps
            .iter()
            .filter(|m| m.perms.contains('x') && m.end <= 1 << 47)
        {
            let id = (m.dev, m.inode);
            let slice = match files.get(&id) {
                Some(f) if m.inode != 0 => self.slice(id, &m.path, f),
                _ => Slice::None("not a file"),
            };
            self.pinned.insert(id);
            let (bias, rows, nrows) = match slice {
                Slice::Rows {
                    first, n, segments, ..
                } => match bias(&segments, m) {
                    Some(b) => (b, first, n),
                    None => (0, 0, 0),
                },
                Slice::None(_) => (0, 0, 0),
            };
            entries.push(UnwindMapping {
                start: m.start,
                end: m.end,
                bias,
                rows,
                nrows,
            });
        }
        entries.sort_by_key(|e| e.start);
        if entries.len() > MAX_UNWIND_MAPPINGS {
            self.stats.mappings_dropped += (entries.len() - MAX_UNWIND_MAPPINGS) as u64;
            entries.truncate(MAX_UNWIND_MAPPINGS);
        }
        if self.pushed.get(&pid) == Some(&entries) {
            return;
        }
        self.gen = self.gen.wrapping_add(1);
        let mut p = UnwindProc {
            nr: entries.len() as u32,
            gen: self.gen,
            maps: [UnwindMapping::default(); MAX_UNWIND_MAPPINGS],
        };
        p.maps[..entries.len()].copy_from_slice(&entries);
        if let Err(e) = self.procs.insert(pid, p, 0) {
            if self.verbose {
                say!("memtrace: unwind table: process {pid}: {e}");
            }
            return;
        }
        // After the table: a memo made before it is not used with it. The
        // shim's copy first: a slot the kernel tags with the old generation
        // meanwhile is then refused, never taken.
        if let Some(g) = &self.shim_gen {
            g.set(self.gen);
        }
        if let Err(e) = self.gen_map.set(0, self.gen, 0) {
            if self.verbose {
                say!("memtrace: unwind table generation: {e}");
            }
        }
        self.pushed.insert(pid, entries);
    }

    /// A descriptor of the tables' generation that maps read-only only
    /// (`genpage`), for memos of unwinds kept elsewhere (memleak's shim).
    pub fn gen_fd(&mut self) -> std::io::Result<std::os::fd::OwnedFd> {
        if self.shim_gen.is_none() {
            self.shim_gen = Some(genpage::GenPage::new(self.gen)?);
        }
        self.shim_gen
            .as_ref()
            .and_then(|g| g.fd())
            .ok_or_else(|| std::io::Error::other("no descriptor"))
    }

    /// `pid` exec'd: the kernel program dropped its table, so the next
    /// update publishes one even if the new maps look like the old.
    pub fn exec(&mut self, pid: u32) {
        self.pushed.remove(&pid);
        if let Some(py) = self.python.as_mut() {
            py.exec(pid);
        }
    }

    /// Forgets a process memtrace no longer keeps.
    pub fn forget(&mut self, pid: u32) {
        if self.pushed.remove(&pid).is_some() {
            let _ = self.procs.remove(&pid);
        }
        if let Some(py) = self.python.as_mut() {
            py.forget(pid);
        }
        self.refreshed.remove(&pid);
    }

    /// Processes whose code had no table, due to have their maps read again
    /// (at most every MISS_EVERY each). The caller reads them and then calls
    /// `missed_done`.
    pub fn missed(&mut self) -> Vec<u32> {
        let now = Instant::now();
        let pids: Vec<u32> = self.misses.keys().filter_map(|k| k.ok()).collect();
        pids.into_iter()
            .filter(|p| {
                self.refreshed
                    .get(p)
                    .is_none_or(|t| now.duration_since(*t) >= MISS_EVERY)
            })
            .collect()
    }

    /// `pid`'s maps are about to be read again for a miss: what was pushed
    /// may be gone from the kernel (a group leader's exit took it), so the
    /// next update publishes whatever it finds.
    pub fn missed_start(&mut self, pid: u32) {
        self.pushed.remove(&pid);
    }

    /// `pid`'s maps were read again: its next miss is reported anew.
    pub fn missed_done(&mut self, pid: u32) {
        self.refreshed.insert(pid, Instant::now());
        let _ = self.misses.remove(&pid);
    }
}

/// Load bias of executable mapping `m` of a file with these segments: the
/// actual address minus the address the file states for the same byte.
fn bias(segments: &[(u64, u64, u64)], m: &Mapping) -> Option<u64> {
    let page = crate::kernel::btf::page_size();
    let (off, _, vaddr) = segments
        .iter()
        .find(|(off, size, _)| off / page * page <= m.offset && m.offset < off + (*size).max(1))?;
    Some(
        m.start
            .wrapping_sub(m.offset)
            .wrapping_add(*off)
            .wrapping_sub(*vaddr),
    )
}

/// The summary's figures for in-kernel unwinding: how each unwind ended
/// (`UNWIND_STATS`) and what the tables hold and left out.
pub fn summary(
    s: &crate::stacks::Traced,
    t: &TableStats,
    seeded: Option<seed::Seeded>,
) -> Vec<(&'static str, crate::output::Value)> {
    use crate::output::Value;
    use memtrace_common::kunwind::stat;
    let ends = s.read_percpu_array(names::UNWIND_STATS).unwrap_or_default();
    let mut v: Vec<(&'static str, Value)> = stat::NAMES
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let total: u64 = ends.get(i).map(|c| c.iter().sum()).unwrap_or(0);
            (*n, Value::from(total))
        })
        .collect();
    v.extend([
        (
            "unwind_table_bytes",
            Value::from(table_bytes(t.capacity_words)),
        ),
        ("unwind_table_used_bytes", Value::from(table_bytes(t.words))),
        ("unwind_rows", Value::from(t.rows)),
        ("unwind_rules", Value::from(t.rules)),
        ("unwind_table_files", Value::from(t.files)),
        ("unwind_rows_unsupported", Value::from(t.rows_unsupported)),
        ("unwind_files_no_info", Value::from(t.files_no_info)),
        ("unwind_files_over_budget", Value::from(t.files_over_budget)),
        ("unwind_mappings_dropped", Value::from(t.mappings_dropped)),
        ("unwind_files_unshared", Value::from(t.files_unshared)),
        ("unwind_files_evicted", Value::from(t.files_evicted)),
        ("unwind_table_build_ms", Value::F(t.build_ms, 1)),
    ]);
    if let Some(py) = t.python_processes {
        v.extend(crate::stacks::python::summary(s, py));
    }
    // System-wide: the processes running at the start, read in the
    // background.
    if let Some(sd) = seeded {
        v.extend([
            ("unwind_running_processes", Value::from(sd.running)),
            ("unwind_running_read", Value::from(sd.read)),
            ("unwind_running_read_ms", Value::F(sd.ms, 0)),
        ]);
        if sd.cut_short {
            v.push(("unwind_running_cut_short", Value::from(1u64)));
        }
    }
    v
}
