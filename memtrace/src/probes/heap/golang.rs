//! The Go heap of a set's Go processes, for memcg's and oomkill's `--heap`.
//! Go's allocator never calls malloc: what the allocator probes see of a
//! Go program is its runtime's reservations from the OS. Its heap in use
//! by stack is read instead from the runtime's own sampled profile
//! (`process::goheap`), for every Go process of the set, about every
//! second and symbolized as read: a process killed before the next read (an
//! OOM kill tears its memory down within milliseconds) is reported as last
//! read, and the title says how long before.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::output::{AllocFigures, Printer, StackReport, Value};
use crate::process::goheap::{estimate, GoHeap, NotRead, Profile};
use crate::process::maps::Mapping;
use crate::stacks::Traced;

/// How often each Go process's profile is read.
const EVERY: Duration = Duration::from_secs(1);
/// Go processes read at once: past it, more are counted, not read.
const MAX_PROCS: usize = 256;
/// How long the last read of a process that is gone is kept (for the
/// report of its kill, which comes after it).
const KEEP_GONE: Duration = Duration::from_secs(60);
/// Images remembered as Go or not (a host's processes share few).
const MAX_IMAGES: usize = 4096;

/// A profile read and symbolized.
pub struct Read {
    pub rows: Vec<StackReport>,
    pub rate: u64,
    pub damaged: bool,
    /// The samples behind the rows.
    pub samples: u64,
    pub at: Instant,
}

impl Read {
    /// `comm`: the process's name, taken while it ran.
    pub fn of(s: &mut Traced, pid: u32, comm: &str, p: &Profile) -> Read {
        let mut rows: Vec<StackReport> = p
            .buckets
            .iter()
            .filter_map(|b| {
                let (n, bytes) = b.in_use();
                let (n, bytes) = estimate(n, bytes, p.rate);
                let (allocs, alloc_bytes) = estimate(b.allocs, b.alloc_bytes, p.rate);
                let (frees, freed_bytes) = estimate(b.frees, b.free_bytes, p.rate);
                (n > 0).then(|| StackReport {
                    pid,
                    comm: comm.to_string(),
                    count: n,
                    bytes: Some(bytes),
                    user: s.sym.user(pid, &b.stack),
                    processes: 1,
                    // Sorted by bytes held, as Go's own heap profile is.
                    alloc: Some(AllocFigures {
                        allocs,
                        bytes: alloc_bytes,
                        frees,
                        freed_bytes,
                        churn: false,
                        estimated: true,
                        by_bytes: true,
                    }),
                    ..Default::default()
                })
            })
            .collect();
        rows.sort_by_key(|r| std::cmp::Reverse(r.bytes));
        Read {
            rows,
            rate: p.rate,
            damaged: p.damaged,
            samples: p.buckets.iter().map(|b| b.in_use().0).sum(),
            at: Instant::now(),
        }
    }

    /// Estimated objects and bytes in use.
    pub fn in_use(&self) -> (u64, u64) {
        let objects = self.rows.iter().map(|r| r.count).sum();
        (objects, self.rows.iter().filter_map(|r| r.bytes).sum())
    }

    /// What the profile is and how it is estimated, for a title; `when`
    /// says when it was read where that is not now.
    pub fn about(&self, when: &str) -> String {
        let rate = match self.rate {
            0 => " (its rate is 0 now: not started yet, or turned off by the program)",
            _ => "",
        };
        let damaged = match self.damaged {
            true => "; the profile's list ended early (a bucket unreadable or damaged)",
            false => "",
        };
        format!(
            "Go's own sampled profile, one sample per {} bytes on average, estimated as \
             runtime/pprof does; allocations since the last collection count as held until one \
             frees them{rate}{when}{damaged}",
            self.rate
        )
    }
}

struct Proc {
    heap: GoHeap,
    last: Option<Read>,
    gone: Option<Instant>,
}

#[derive(Default)]
pub struct GoHeaps {
    procs: HashMap<u32, Proc>,
    /// Whether each image (device, inode) is Go.
    images: HashMap<((u32, u32), u64), bool>,
    /// The programs' file names, for the reservations left out of the
    /// malloc-level report.
    pub names: Vec<String>,
    read_at: Option<Instant>,
    /// Go processes whose heap could not be read (said once each program).
    unread: u64,
    said: HashSet<String>,
    /// Go processes past the bound, not read.
    over: u64,
    /// Turn on the profiling a Go linker left off (where the shim is
    /// loaded into processes: the program is written to either way).
    pub turn_on: bool,
    turned_on: u64,
}

impl GoHeaps {
    /// Takes `pid` in if it is a Go program whose profile can be read:
    /// whether it was.
    pub fn take(&mut self, pid: u32, maps: &[Mapping]) -> bool {
        let Some(image) = maps.iter().find(|m| m.inode != 0) else {
            return false;
        };
        let key = (image.dev, image.inode);
        if self.images.get(&key) == Some(&false) || self.procs.contains_key(&pid) {
            return self.procs.contains_key(&pid);
        }
        if self.images.len() >= MAX_IMAGES {
            self.images.clear();
        }
        let heap = match GoHeap::open(pid) {
            Err(NotRead::NotGo) => {
                self.images.insert(key, false);
                return false;
            }
            Err(why) => {
                self.images.insert(key, true);
                self.unread += 1;
                let name = crate::process::proc::comm(pid).unwrap_or_default();
                if self.said.len() < MAX_IMAGES && self.said.insert(name.clone()) {
                    say!(
                        "memtrace: --heap: PID {pid} ({name}) is a Go program and its Go heap \
                         cannot be read by function: {why}. What is shown of it is the Go \
                         runtime's reservations from the OS"
                    );
                }
                return false;
            }
            Ok(h) => h,
        };
        self.images.insert(key, true);
        if heap.linker_off() && !self.turn_on(pid, &heap) {
            return false;
        }
        if self.procs.len() >= MAX_PROCS {
            self.over += 1;
            return false;
        }
        let name = image
            .path
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        if !name.is_empty() && !self.names.contains(&name) {
            self.names.push(name);
        }
        self.procs.insert(
            pid,
            Proc {
                heap,
                last: None,
                gone: None,
            },
        );
        true
    }

    /// Turns on the profiling `pid`'s linker left off where allowed, said
    /// once a program; whether it is on.
    fn turn_on(&mut self, pid: u32, heap: &GoHeap) -> bool {
        let name = crate::process::proc::comm(pid).unwrap_or_default();
        let first = self.said.len() < MAX_IMAGES && self.said.insert(name.clone());
        let why = match self.turn_on {
            true => match heap.turn_on() {
                Ok(()) => {
                    self.turned_on += 1;
                    if first {
                        say!(
                            "memtrace: --heap: PID {pid} ({name}) is a Go program whose linker \
                             left heap profiling off: turned on at Go's default rate, put back \
                             at exit (--no-inject leaves such programs as they are)"
                        );
                    }
                    return true;
                }
                Err(e) => format!("turning its profiling on failed: {e}"),
            },
            false => NotRead::ProfilingOff.to_string(),
        };
        self.unread += 1;
        if first {
            say!(
                "memtrace: --heap: PID {pid} ({name}) is a Go program and its Go heap cannot be \
                 read by function: {why}. What is shown of it is the Go runtime's reservations \
                 from the OS"
            );
        }
        false
    }

    /// `pid` exec'd: its profile was its old image's.
    pub fn exec(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    /// Reads every live Go process's profile if a read is due; forgets
    /// those gone long enough.
    pub fn tick(&mut self, s: &mut Traced) {
        if self.read_at.is_some_and(|t| t.elapsed() < EVERY) {
            return;
        }
        self.read_at = Some(Instant::now());
        self.procs
            .retain(|_, p| p.gone.is_none_or(|t| t.elapsed() < KEEP_GONE));
        let pids: Vec<u32> = self.procs.keys().copied().collect();
        for pid in pids {
            self.read(s, pid);
        }
    }

    /// Reads `pid`'s profile now; gone, its last read stands.
    fn read(&mut self, s: &mut Traced, pid: u32) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        if p.gone.is_some() {
            return;
        }
        match p.heap.read() {
            Ok(prof) if crate::process::proc::alive(pid) => {
                let comm = crate::process::proc::comm(pid).unwrap_or_default();
                p.last = Some(Read::of(s, pid, &comm, &prof));
            }
            _ => p.gone = Some(Instant::now()),
        }
    }

    /// Estimated bytes of the Go heap `pid` held at its last read.
    pub fn held(&self, pid: u32) -> Option<u64> {
        Some(self.procs.get(&pid)?.last.as_ref()?.in_use().1)
    }

    /// The Go heap of each Go process of `pids`, under `title`, read now
    /// where the process still runs.
    pub fn report(
        &mut self,
        s: &mut Traced,
        pids: &HashSet<u32>,
        title: &str,
        out: &mut dyn Printer,
    ) {
        let mut go: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|p| self.procs.contains_key(p))
            .collect();
        go.sort_unstable();
        for pid in go {
            self.read(s, pid);
            let p = &self.procs[&pid];
            let Some(last) = &p.last else {
                continue;
            };
            let age = last.at.elapsed().as_secs_f64();
            let when = match p.gone {
                Some(_) => format!(", as last read while it ran, {age:.1} s before"),
                None => String::new(),
            };
            let t = format!(
                "{title}: its Go heap in use (PID {pid}), from {}:",
                last.about(&when)
            );
            out.stacks("go_heap", &t, &last.rows);
        }
    }

    pub fn summary(&self) -> Vec<(&'static str, Value)> {
        if self.procs.is_empty() && self.unread == 0 && self.over == 0 {
            return Vec::new();
        }
        vec![
            ("heap_go_processes", Value::from(self.procs.len() as u64)),
            ("heap_go_unread", Value::from(self.unread)),
            ("heap_go_profiling_turned_on", Value::from(self.turned_on)),
            ("heap_go_not_read_over_bound", Value::from(self.over)),
        ]
    }
}
