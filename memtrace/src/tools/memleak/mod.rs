//! `memtrace memleak`: allocations outstanding by stack. With `-p`/`-c`, the
//! process's allocator by uprobes (placed where the kernel emulates the
//! probed instruction) and its anonymous mmaps; without, the kernel's
//! allocators by the kmem tracepoints and kernel stacks.

mod args;
mod batches;
mod golang;
mod preload;
mod summary;
mod unseen;

pub use args::{Args, Sort};
use args::{DEFAULT_MAX_ALLOCS, DEFAULT_MAX_STACKS};

use memtrace_common::{
    memleak::{counter, MemleakConfig, PENDING_SLOTS},
    names::{MEMLEAK_CFG, ML_COUNTS, ML_EARLY_FREES, ML_EXECS, ML_MEMO, ML_PENDING},
    shim::{EARLY_FREES, MEMO_SLOTS},
    stack_mode,
};

use crate::error::{Error, Result};
use crate::output::{Printer, Value};
use crate::probes::heap::injection::Injection;
use crate::probes::heap::{execs, exited, points, report, shim};
use crate::run::args::IntervalArgs;
use crate::run::tool::{About, Prep, Tool};
use crate::session::attach::Probe;
use crate::stacks::args::StackArgs;
use crate::stacks::Traced;

pub struct Memleak {
    args: Args,
    user: bool,
    probes: Vec<Probe>,
    /// How each allocator function was probed, for `-v` and the summary.
    placements: Vec<String>,
    /// The probed allocator's file name when it maps arenas of its own.
    arenas: Vec<String>,
    /// The shim preloaded into the `-c` command, when it is, and the name
    /// its memo of stacks is served at.
    preload: Option<shim::Installed>,
    memo: Option<String>,
    /// The shim to load into the `-p` process, until it is (or is not).
    inject_from: Option<shim::Installed>,
    injection: Option<Injection>,
    /// Frees in the shim's batches at the last report (applied later).
    pending_frees: u64,
    /// Allocations from the memo in the batches at the last report, held.
    pending_allocs: u64,
    /// The process traced (`-p`, `-c`): its exit ends the run, and the
    /// final report reads its blocks, so they are never swept before.
    target: Option<u32>,
    counts: [u64; counter::NR as usize],
    phase: report::Phase,
    exited: exited::Exited,
    execs: execs::Execs,
    /// The Go heap, when the process is a Go program.
    go: golang::GoView,
    /// Arena mappings and bytes the last report left out.
    left: report::LeftOut,
}

impl Memleak {
    pub fn new(a: &Args) -> Result<Self> {
        if matches!((a.min_size, a.max_size), (Some(lo), Some(hi)) if lo > hi) {
            return Err(Error::Usage("--min-size is larger than --max-size".into()));
        }
        let user = a.common.pid.is_some() || a.common.command.is_some();
        if !user && (a.object.is_some() || !a.symbol_prefix.is_empty()) {
            return Err(Error::Usage(
                "-O and --symbol-prefix need a process (-p PID or -c CMD)".into(),
            ));
        }
        let preload = match preload::unusable(a) {
            None if a.common.command.is_some() => {
                let i = shim::install()?;
                if a.common.verbose {
                    say!("memtrace: memleak: allocator shim: {}", i.how());
                }
                Some(i)
            }
            None => None,
            Some(why) => {
                if a.common.command.is_some() && a.common.verbose && !a.no_preload {
                    say!("memtrace: memleak: allocator shim not preloaded: {why}; uprobes instead");
                }
                None
            }
        };
        let inject_from = (a.common.pid.is_some() && preload::injectable(a))
            .then(shim::install)
            .and_then(|r| r.ok());
        Ok(Memleak {
            memo: preload::memo_name(a, preload.is_some()),
            inject_from,
            injection: None,
            pending_frees: 0,
            pending_allocs: 0,
            args: a.clone(),
            user,
            probes: Vec::new(),
            placements: Vec::new(),
            arenas: Vec::new(),
            preload,
            target: None,
            counts: [0; counter::NR as usize],
            phase: report::Phase::default(),
            exited: exited::Exited::new(a.max_kept),
            execs: execs::Execs::default(),
            go: Default::default(),
            left: (0, 0),
        })
    }

    fn tables(&self) -> report::Tables {
        if self.user {
            report::USER
        } else {
            report::KERNEL
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
}

pub const ABOUT: About = About {
    name: "memleak",
    help: "Allocations outstanding by stack: a process's allocator, or the kernel's",
    traces: "outstanding allocations",
    interval: None,
};

impl Tool for Memleak {
    fn about(&self) -> &'static About {
        &ABOUT
    }
    fn what(&self) -> String {
        let what = if self.user {
            "outstanding allocations"
        } else {
            "outstanding kernel allocations"
        };
        match self.args.sample_bytes {
            Some(n) => format!("{what} (sampled, one per {n} bytes)"),
            None => what.into(),
        }
    }
    fn probes(&self) -> Vec<Probe> {
        self.probes.clone()
    }
    fn command_env(&self) -> Vec<(String, String)> {
        match &self.preload {
            Some(shim) => preload::env(shim.path(), &self.args, self.memo.as_deref()),
            None => Vec::new(),
        }
    }
    fn stack_mode(&self) -> u32 {
        if !self.user {
            return stack_mode::KERNEL;
        }
        stack_mode::USER
            | if self.args.kernel_stacks {
                stack_mode::KERNEL
            } else {
                0
            }
    }
    fn user_stacks(&self) -> Option<(&StackArgs, bool)> {
        self.user.then_some((&self.args.stacks, false))
    }
    fn top(&self) -> Option<usize> {
        self.args.top
    }
    fn text_top(&self) -> usize {
        10
    }
    fn folded(&self) -> bool {
        self.args.folded
    }
    fn intervals(&self) -> Option<&IntervalArgs> {
        Some(&self.args.interval)
    }

    fn prepare(&mut self, k: &mut Prep) -> Result<()> {
        // A copied stack is unwound here, after the fact: memleak keeps a
        // stack id per live block, so its dwarf stacks are unwound in the
        // kernel program or not at all.
        if k.stacks & stack_mode::DWARF != 0 {
            return Err(Error::Usage(
                "memleak keeps a stack id per live allocation: its dwarf stacks are unwound in the \
                 kernel only (not with --unwinder copy or --sample, nor where this kernel refused \
                 the in-kernel unwinder: see -v); use --stack-mode fp"
                    .into(),
            ));
        }
        let mut cfg = MemleakConfig {
            min_size: self.args.min_size.unwrap_or(0),
            max_size: self.args.max_size.unwrap_or(0),
            sample_bytes: self.args.sample_bytes.unwrap_or(0),
            page_size: crate::kernel::btf::page_size() as u32,
            shim_memo: self.memo.is_some() as u32,
            ..Default::default()
        };
        self.target = k.target;
        // A Go program's allocator calls no malloc: no shim to load.
        let go = k.target.is_some_and(|pid| self.go.open(pid));
        let injected = match (&self.inject_from, k.target) {
            (Some(shim), Some(pid)) if !go => {
                match Injection::start(
                    pid,
                    shim.path(),
                    self.args.sample_bytes.unwrap_or(0),
                    "memleak",
                ) {
                    Ok(i) => Some(i),
                    Err(why) => {
                        say!("memtrace: memleak: not loading the allocator shim into pid {pid}: {why}; uprobes instead");
                        None
                    }
                }
            }
            _ => None,
        };
        let (probes, placements) = if let Some((i, said)) = injected {
            let (p, _) = shim::probes(i.shim(), k.target)?;
            self.injection = Some(i);
            (p, said)
        } else if let Some(shim) = &self.preload {
            // Every process of a -c command: only they map this run's shim,
            // so probes for all processes trap nobody else. Probing the
            // command's first process alone missed what the processes it
            // starts allocate (`sh -c prog`, make, a Python subprocess).
            let follow = self.args.common.children || self.args.common.command.is_some();
            shim::probes(shim.path(), if follow { None } else { k.target })?
        } else if self.user {
            let a = &self.args;
            let follow = a.common.children
                || a.common
                    .command
                    .as_deref()
                    .is_some_and(|c| !crate::process::command::is_simple(c));
            let at = points::Points {
                object: a.object.as_deref(),
                prefix: &a.symbol_prefix,
                running: a.common.pid.and(k.target),
                program: a.common.command.as_deref(),
                // One process unless its children are followed: then the
                // breakpoints go into every process mapping the object (the
                // kernel filters by mm), and the programs keep the followed.
                only: if follow { None } else { k.target },
                session: !a.no_uprobe_session,
                at_entry: a.probe_at_entry,
            };
            self.execs.probed = points::static_inode(&at);
            let mut p = points::user(&at)?;
            if let (true, Some(obj)) = (follow, &p.object) {
                // The cost falls on processes nobody asked to trace: say so.
                say!(
                    "memtrace: memleak: following child processes puts the probes in every process that maps {obj} \
                     (uprobes are filtered in the kernel for one process only): their allocator calls take the trap too \
                     while memleak runs (about 1 us each); -p PID or a simple -c command keeps it to one process"
                );
            }
            self.arenas = p
                .object
                .as_deref()
                .and_then(points::arena_name)
                .into_iter()
                .collect();
            p.probes.extend(points::mmap_probes(&mut cfg)?);
            (p.probes, p.said)
        } else {
            (points::kernel(&mut cfg)?, Vec::new())
        };
        if self.args.common.verbose {
            for p in &placements {
                say!("memtrace: memleak: {p}");
            }
        }
        self.probes = probes;
        self.placements = placements;
        k.loader.global(MEMLEAK_CFG, &cfg);
        let t = self.tables();
        if self.user {
            k.loader.max_entries(ML_PENDING, PENDING_SLOTS);
            k.loader.max_entries(ML_EXECS, 4096);
        }
        // Kernel mode preallocates: a smaller default table.
        let allocs = match (self.user, self.args.max_allocs) {
            (false, n) if n == DEFAULT_MAX_ALLOCS => 1 << 18,
            (_, n) => n.max(1),
        };
        let stacks = match (self.user, self.args.max_stacks) {
            (false, n) if n == DEFAULT_MAX_STACKS => 1 << 14,
            (_, n) => n.max(1),
        };
        k.loader.max_entries(t.allocs, allocs);
        k.loader.max_entries(t.stacks, stacks);
        k.loader.max_entries(ML_COUNTS, counter::NR);
        if self.memo.is_some() {
            k.loader.max_entries(ML_MEMO, MEMO_SLOTS);
            k.loader.max_entries(ML_EARLY_FREES, EARLY_FREES);
        }
        Ok(())
    }

    fn report(&mut self, s: &mut Traced, out: &mut dyn Printer, _clear: bool) -> Result<()> {
        // Outstanding allocations are a state, not a count per interval:
        // every report shows all that is held (as BCC does).
        self.read_counts(s)?;
        if self.user {
            self.execs.sweep(s, self.tables())?;
        }
        // Frees the shim's threads still hold in batches: not held.
        let pending = batches::pending(s);
        self.pending_frees = pending.nr_frees;
        self.pending_allocs = pending.allocs.len() as u64;
        let exited_rows = self.exited.kept.resolved_reports(false);
        // A Go program's mmaps are its runtime's reservations: left out
        // when its heap is shown by the runtime's profile instead.
        let mut arenas = self.arenas.clone();
        if self.go.readable() {
            arenas.extend(self.go.exe_name.clone());
        }
        let view = report::View {
            exited_rows: &exited_rows,
            pending: &pending.frees,
            pending_allocs: &pending.allocs,
            by_bytes: self.args.sort == Sort::Size,
            older: self.args.older,
            churn: self.args.all,
            estimated: self.args.sample_bytes.is_some(),
            only: None,
            arenas: &arenas,
        };
        let (reports, left) = report::outstanding(
            s,
            self.tables(),
            view,
            (&self.phase, &self.exited.kept.counts, &self.execs.gone),
            self.stack_mode(),
        )?;
        // As BCC: the number asked for (merging may leave fewer).
        let n = self.args.top.unwrap_or(self.text_top());
        let est = if self.args.sample_bytes.is_some() {
            " (estimated from samples)"
        } else {
            ""
        };
        self.left = left;
        let left = report::left_out(left, &arenas);
        let title = format!(
            "[{}] Top {n} stacks with outstanding allocations{est}{left}:",
            crate::output::clock()
        );
        out.stacks("memleak", &title, &reports);
        self.go.report(s, out);
        Ok(())
    }

    fn on_interval(&mut self, s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        self.report(s, out, false)
    }

    fn on_start(&mut self, s: &mut Traced) -> Result<()> {
        if let Some(pid) = self.target {
            if self.go.open(pid) {
                // A -c command is stopped at its exec: its runtime has not run.
                let command = self.args.common.command.is_some();
                self.go.turn_on(self.args.no_inject, command);
                self.go.tick(true);
                if let (Some(hook), true) =
                    (self.go.exit_hook(), self.args.common.command.is_some())
                {
                    s.sym.maps.lock().unwrap().exit_hooks.push(hook);
                }
            }
        }
        if let Some(name) = &self.memo {
            preload::serve_memo(s, name, self.args.common.verbose);
        }
        match &mut self.injection {
            Some(i) => i.redirect(self.args.common.verbose),
            None => Ok(()),
        }
    }

    fn finish(&mut self, s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        if let Some(i) = &mut self.injection {
            i.restore();
        }
        // Processes gone since the last round are reported as exited too.
        self.forget_exited(s)?;
        self.report(s, out, false)?;
        self.go.put_back();
        self.say_if_unseen();
        Ok(())
    }

    /// SIGUSR1: what is outstanding now, then a new phase: later reports
    /// show only what is allocated after this point and still held.
    fn on_mark(&mut self, s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        self.report(s, out, false)?;
        self.phase = report::Phase::start(s, self.tables())?;
        say!("memtrace: memleak: new phase: reports now show allocations made from here on");
        Ok(())
    }

    fn events(&self) -> u64 {
        self.counts[counter::ALLOCS as usize] + self.counts[counter::FREES as usize]
    }

    fn forget_exited(&mut self, s: &mut Traced) -> Result<usize> {
        if let Some(i) = &mut self.injection {
            i.catch_up();
        }
        // For --progress: the counts so far, not only at reports.
        self.read_counts(s)?;
        self.go.tick(false);
        // Kernel objects outlive the process that allocated them.
        if !self.user {
            return Ok(0);
        }
        self.execs.sweep(s, self.tables())?;
        let moved = self.exited.reclaim(s, self.tables(), self.target)?;
        let mode = self.stack_mode();
        let figures = self.args.figures();
        self.exited.resolve(s, mode, figures, &self.execs.gone);
        Ok(moved)
    }

    fn summary_extra(&self) -> Vec<(&'static str, Value)> {
        self.summary_rows()
    }
}
