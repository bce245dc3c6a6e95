//! The heap of a set of processes, sampled: memcg's `--heap` (a group's
//! processes) and oomkill's (every process). Each process's allocator is
//! probed once per object (processes that join later and map another one
//! get its probes then); the programs keep the set's processes, and what a
//! process holds by stack is read when asked: at a warning, at a kill.

use std::collections::HashSet;

use memtrace_common::{
    memleak::{counter, MemleakConfig, PENDING_SLOTS},
    names::{MEMLEAK_CFG, ML_COUNTS, ML_EXECS, ML_PENDING},
    stack_mode,
};

use super::points::{self, Points};
use super::report::{self, Phase, Tables, View, USER};
use super::{execs::Execs, exited::Exited, golang::GoHeaps, shimmed::Shimmed};

mod shim_in;
mod take_in;
use crate::error::{Error, Result};
use crate::output::{Printer, Value};
use crate::process::maps::{read_maps, Mapping};
use crate::session::attach::Probe;
use crate::session::uprobe::is_libc;
use crate::stacks::Traced;

/// Live blocks and stacks the kernel's tables hold (allocated as used).
const MAX_ALLOCS: u32 = 1 << 20;
const MAX_STACKS: u32 = 1 << 18;

pub struct HeapWatch {
    /// One sample per this many bytes on average; 0: every allocation.
    pub sample: u64,
    /// The processes of the memory cgroups memcg watches (else the
    /// filter's: every process for oomkill).
    by_group: bool,
    /// Processes already looked at: maps read, allocator probed.
    seen: HashSet<u32>,
    /// Processes found at the last look and not taken in yet (`settle`).
    candidates: HashSet<u32>,
    /// The allocator objects probed, by (device, inode) of each.
    objects: HashSet<Vec<Object>>,
    probes: Vec<Probe>,
    probed: Vec<String>,
    /// File names of the probed allocators other than a C library.
    arenas: Vec<String>,
    /// What the last report left out of them.
    arena_bytes: u64,
    /// The set-up said (a retried set-up says it once).
    said: bool,
    exited: Exited,
    execs: Execs,
    counts: [u64; counter::NR as usize],
    /// Processes whose allocator could not be probed, and why (said once).
    unprobed: u64,
    /// The shim loaded into the processes taken in (else uprobes).
    shim: Option<Shimmed>,
    /// Processes the shim was loaded into (or refused) at the set-up, not
    /// to be taken in again.
    taken: HashSet<u32>,
    /// Processes found too young to load the shim into, and how many of
    /// them were gone before they were old enough.
    young: HashSet<u32>,
    young_gone: u64,
    /// Processes gone while their probes went on.
    gone_before_probes: u64,
    /// The Go programs among them: their Go heap, from Go's own profile.
    go: GoHeaps,
}

impl HeapWatch {
    pub fn new(sample: u64, by_group: bool) -> HeapWatch {
        HeapWatch {
            sample,
            by_group,
            seen: HashSet::new(),
            candidates: HashSet::new(),
            objects: HashSet::new(),
            probes: Vec::new(),
            probed: Vec::new(),
            arenas: Vec::new(),
            arena_bytes: 0,
            said: false,
            exited: Exited::new(crate::stacks::kept::MAX_KEPT),
            execs: Execs::default(),
            counts: [0; counter::NR as usize],
            unprobed: 0,
            shim: None,
            taken: HashSet::new(),
            young: HashSet::new(),
            young_gone: 0,
            gone_before_probes: 0,
            go: GoHeaps::default(),
        }
    }

    pub fn probes(&self) -> Vec<Probe> {
        self.probes.clone()
    }

    /// The allocators `pids` map, probed, and the tables sized. `stacks`
    /// is Prep's: a copied stack cannot be unwound after the fact for a
    /// block still held, so copy-mode DWARF is refused.
    pub fn prepare(
        &mut self,
        loader: &mut crate::session::Loader,
        stacks: u32,
        pids: &[u32],
    ) -> Result<()> {
        if stacks & stack_mode::DWARF != 0 {
            return Err(Error::Usage(
                "--heap keeps a stack id per live allocation: its dwarf stacks are unwound in the \
                 kernel only; use --stack-mode fp"
                    .into(),
            ));
        }
        // Called again when a set-up is retried without the in-kernel unwinder.
        self.probes.clear();
        self.probed.clear();
        self.arenas.clear();
        self.objects.clear();
        let mut cfg = MemleakConfig {
            sample_bytes: self.sample,
            page_size: crate::kernel::btf::page_size() as u32,
            by_group: self.by_group as u32,
            ..Default::default()
        };
        if self.shim.is_some() {
            return self.prepare_shim(loader, cfg, pids);
        }
        for &pid in pids {
            let maps = read_maps(pid).unwrap_or_default();
            if let Some(p) = self.allocator_of(pid, &maps) {
                self.probes.extend(p);
            }
        }
        if self.objects.is_empty() {
            // Nothing runs there yet: the C library memtrace maps, which
            // the processes that come are most likely to map too.
            let own = read_maps(std::process::id()).unwrap_or_default();
            self.objects.extend(allocator_key(&own).map(|k| k.0));
            let p = points::user(&Points {
                session: true,
                ..Default::default()
            })?;
            self.note(&p);
            self.probes.extend(p.probes);
        }
        self.probes.extend(points::mmap_probes(&mut cfg)?);
        size_tables(loader, &cfg);
        if std::mem::replace(&mut self.said, true) {
            return Ok(());
        }
        let sampled = self.sampled();
        say!(
            "memtrace: --heap: allocator calls ({sampled}) by uprobes in {}; every process that \
             maps one takes the trap (about 1 us a call), the kernel programs keep {}",
            self.probed.join(", "),
            if self.by_group {
                "the calls of the watched groups' processes"
            } else {
                "every process's calls"
            }
        );
        Ok(())
    }

    fn sampled(&self) -> String {
        match self.sample {
            0 => "every allocation".to_string(),
            n => format!(
                "sampled, one per {} bytes on average",
                crate::output::human(n)
            ),
        }
    }

    fn read_counts(&mut self, s: &Traced) -> Result<()> {
        for (i, per_cpu) in s.read_percpu_array(ML_COUNTS)?.iter().enumerate() {
            if let Some(c) = self.counts.get_mut(i) {
                *c = per_cpu.iter().sum();
            }
        }
        Ok(())
    }

    /// What exited processes held moves out of the kernel's tables (kept
    /// for reports), and the blocks of images that exec'd away go.
    pub fn forget_exited(&mut self, s: &mut Traced) -> Result<usize> {
        self.read_counts(s)?;
        self.seen.retain(|&p| crate::process::proc::alive(p));
        if let Some(sh) = self.shim.as_mut() {
            sh.forget_gone(|p| self.seen.contains(&p));
            sh.catch_up();
            let before = self.young.len();
            self.young.retain(|&p| crate::process::proc::alive(p));
            self.young_gone += (before - self.young.len()) as u64;
        }
        self.sweep(s)?;
        self.go.tick(s);
        self.exited.reclaim(s, USER, None)
    }

    /// The blocks of images that exec'd away go; a process that exec'd is
    /// taken in again (its new image has no shim, and may be a Go program).
    fn sweep(&mut self, s: &mut Traced) -> Result<()> {
        for (pid, at) in self.execs.sweep(s, USER)? {
            if self.shim.as_mut().is_none_or(|sh| sh.exec(pid, at)) {
                self.seen.remove(&pid);
                self.go.exec(pid);
            }
        }
        Ok(())
    }

    /// What `pids` hold, by stack, biggest first, printed as `kind`.
    pub fn report(
        &mut self,
        s: &mut Traced,
        pids: &HashSet<u32>,
        kind: &'static str,
        title: &str,
        out: &mut dyn Printer,
    ) -> Result<()> {
        self.read_counts(s)?;
        self.sweep(s)?;
        // A Go program's reservations are left out where its Go heap is shown.
        let arenas: Vec<String> = self.arenas.iter().chain(&self.go.names).cloned().collect();
        let view = View {
            pending: &[],
            pending_allocs: &[],
            by_bytes: true,
            estimated: self.sample > 0,
            only: Some(pids),
            arenas: &arenas,
            ..Default::default()
        };
        let phase = Phase::default();
        let t: Tables = USER;
        let (reports, left) = report::outstanding(
            s,
            t,
            view,
            (&phase, &self.exited.kept.counts, &self.execs.gone),
            stack_mode::USER,
        )?;
        let est = if self.sample > 0 {
            " (estimated from samples)"
        } else {
            ""
        };
        self.arena_bytes = left.1;
        let left = report::left_out(left, &arenas);
        out.stacks(kind, &format!("{title}{est}{left}"), &reports);
        self.go.report(s, pids, title, out);
        Ok(())
    }

    /// The `n` processes of `among` that hold most (by the estimate's
    /// bytes), biggest first; processes holding nothing are not named.
    pub fn biggest(&mut self, s: &mut Traced, among: &HashSet<u32>, n: usize) -> Result<Vec<u32>> {
        let mut by_pid: std::collections::HashMap<u32, u64> = Default::default();
        let live = s.read_folded(USER.stacks, false)?;
        let kept = self.exited.kept.counts.iter().map(|(k, v)| (*k, *v));
        for (k, v) in live.into_iter().chain(kept) {
            if among.contains(&k.tgid) {
                *by_pid.entry(k.tgid).or_default() += v.bytes.saturating_sub(v.freed_bytes);
            }
        }
        // A Go program by its Go heap, not its reservations.
        for &pid in among {
            if let Some(held) = self.go.held(pid) {
                by_pid.insert(pid, held);
            }
        }
        let mut top: Vec<(u32, u64)> = by_pid.into_iter().filter(|p| p.1 > 0).collect();
        top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        Ok(top.into_iter().take(n).map(|p| p.0).collect())
    }

    pub fn summary(&self) -> Vec<(&'static str, Value)> {
        let c = |i: u32| Value::from(self.counts[i as usize]);
        let mut v = vec![
            ("heap_allocations", c(counter::ALLOCS)),
            ("heap_frees", c(counter::FREES)),
        ];
        if self.sample > 0 {
            v.push(("heap_not_sampled", c(counter::UNSAMPLED)));
        }
        v.push(("heap_unprobed_processes", Value::from(self.unprobed)));
        v.push((
            "heap_gone_before_probes",
            Value::from(self.gone_before_probes),
        ));
        if !self.arenas.is_empty() {
            v.push(("heap_arena_bytes_left_out", Value::from(self.arena_bytes)));
        }
        v.extend(self.exited.summary());
        if self.shim.is_some() {
            v.push(("heap_gone_before_shim", Value::from(self.young_gone)));
        }
        v.extend(self.shim.iter().flat_map(Shimmed::summary));
        v.extend(self.go.summary());
        v
    }
}

/// The kernel's tables sized, and the configuration set.
fn size_tables(loader: &mut crate::session::Loader, cfg: &MemleakConfig) {
    loader.global(MEMLEAK_CFG, cfg);
    loader.max_entries(ML_PENDING, PENDING_SLOTS);
    loader.max_entries(ML_EXECS, 4096);
    loader.max_entries(USER.allocs, MAX_ALLOCS);
    loader.max_entries(USER.stacks, MAX_STACKS);
    loader.max_entries(ML_COUNTS, counter::NR);
}

/// The files that may hold a process's allocator, by device and inode
/// (from its maps: no stat): its C library and any "...alloc..." library,
/// or for a static program its own image; and whether libraries were found.
fn allocator_key(maps: &[Mapping]) -> Option<(Vec<Object>, bool)> {
    let name = |m: &Mapping| m.path.rsplit('/').next().unwrap_or("").to_string();
    let mut key: Vec<Object> = maps
        .iter()
        .filter(|m| m.path.starts_with('/') && m.inode != 0)
        .filter(|m| {
            let n = name(m);
            is_libc(&n) || n.contains("alloc")
        })
        .map(|m| (m.dev, m.inode))
        .collect();
    let libs = !key.is_empty();
    if !libs {
        // The image is mapped first.
        let image = maps.iter().find(|m| m.inode != 0)?;
        key.push((image.dev, image.inode));
    }
    key.sort_unstable();
    key.dedup();
    Some((key, libs))
}

/// A mapped file: device (major, minor) and inode.
type Object = ((u32, u32), u64);
