//! The allocator shim (memtrace/preload/memtrace_preload.c, compiled by
//! build.rs): glibc's allocator calls go through it, and it reports the
//! ones followed at probe sites that start with a nop (emulated by the
//! kernel: no single-step), one site per call, after sampling in the
//! process itself. `memleak -c` preloads it; `memleak -p` and memcg's
//! `--heap` load it into running processes (`injection`).

use std::path::Path;

use memtrace_common::memleak::SITE_GENERATIONS;
use memtrace_common::names::{
    ML_BATCH_EXIT, ML_PRELOAD_ALLOC, ML_PRELOAD_BATCH, ML_PRELOAD_FREE, ML_PRELOAD_FREES,
    ML_PRELOAD_FULL, ML_PRELOAD_HELLO,
};
use memtrace_common::naming::Prog;

use super::SHIM_PREFIX as FILE_PREFIX;
use crate::error::{Error, Result};
use crate::session::attach::Probe;
use crate::session::uprobe::Symbols;

static SHIM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/memtrace_preload.so"));

/// Whether this memtrace was built with the shim.
pub fn built() -> bool {
    !SHIM.is_empty()
}

/// The shim's bytes, as built (parsed from here, never read back from a
/// file a process could have changed).
pub fn bytes() -> &'static [u8] {
    SHIM
}

/// Writes the shim for this run where the command (and processes of this
/// mount namespace) can map it: see `safe_dir`. Removed when dropped.
pub fn install() -> Result<Installed> {
    let mut tried = Vec::new();
    for (dir, private) in [
        ("/run/memtrace", false),
        ("/var/tmp", true),
        ("/tmp", true),
        ("/dev/shm", true),
    ] {
        match super::safe_dir::place(Path::new(dir), private, SHIM, FILE_PREFIX) {
            Ok(i) => return Ok(i),
            Err(e) => tried.push(format!("{dir}: {e}")),
        }
    }
    Err(Error::Usage(format!(
        "cannot write the allocator shim safely ({}): use --no-preload (memleak -c) or --no-inject",
        tried.join("; ")
    )))
}

pub use super::safe_dir::Installed;

/// The probes on the shim's sites, with the tracepoints of execs and of
/// threads' exits. Only processes that loaded the shim map it: following
/// children puts no probe in anyone else.
pub fn probes(shim: &Path, pid: Option<u32>) -> Result<(Vec<Probe>, Vec<String>)> {
    let mut probes = sites(shim, pid)?;
    probes.push(crate::probes::heap::points::execs());
    probes.push(
        Probe::new("frees left in an exiting thread's batch").tracepoint(
            ML_BATCH_EXIT,
            "sched",
            "sched_process_exit",
        ),
    );
    let said = vec![format!(
        "allocator: glibc's, through the shim preloaded from {} (one probe per call, \
         at a nop, entered by a system call from Linux 6.17 on, else by a trap; sampling done in the process; \
         exact, a call from a stack the kernel already unwound is queued in the process with it, from the memo)",
        shim.display()
    )];
    Ok((probes, said))
}

/// The probes on the shim's sites alone (a copy of it, for one process).
pub fn sites(shim: &Path, pid: Option<u32>) -> Result<Vec<Probe>> {
    // Offsets from memtrace's own bytes (what every copy holds).
    let syms = Symbols::from_bytes(SHIM.to_vec());
    let path = shim.to_string_lossy().into_owned();
    let mut probes = Vec::new();
    let mut wanted: Vec<(String, Prog, String)> = Vec::new();
    // The hot sites by generation (sites.c), then the last one.
    for (site, prog, what) in [
        (
            "memtrace_alloc_site",
            ML_PRELOAD_ALLOC,
            "allocations (preloaded shim)",
        ),
        (
            "memtrace_free_site",
            ML_PRELOAD_FREE,
            "frees (preloaded shim)",
        ),
    ] {
        for g in 0..SITE_GENERATIONS {
            wanted.push((
                format!("{site}_{g}"),
                prog,
                format!("{what}, site generation {g}"),
            ));
        }
        wanted.push((site.to_string(), prog, what.to_string()));
    }
    for (site, prog, what) in [
        (
            "memtrace_frees_site",
            ML_PRELOAD_FREES,
            "frees in batches (preloaded shim)",
        ),
        (
            "memtrace_batch_site",
            ML_PRELOAD_BATCH,
            "threads' batches of frees (preloaded shim)",
        ),
        (
            "memtrace_table_full_site",
            ML_PRELOAD_FULL,
            "samples the shim could not keep",
        ),
        (
            "memtrace_hello_site",
            ML_PRELOAD_HELLO,
            "processes loading the shim",
        ),
    ] {
        wanted.push((site.to_string(), prog, what.to_string()));
    }
    // One link per program where the kernel has uprobe_multi: each
    // perf-event uprobe's detach waits out a grace period of its own, one
    // after another, and Ctrl-C took seconds.
    // (program, what it counts, its points: offset and cookie)
    type Points = Vec<(u64, u64)>;
    let mut by_prog: Vec<(Prog, String, Points)> = Vec::new();
    for (site, prog, what) in wanted {
        let f = syms
            .function(&site)
            .ok_or_else(|| Error::Usage(format!("{}: no function {site}", shim.display())))?;
        match by_prog.iter_mut().find(|(p, ..)| *p == prog) {
            Some((_, _, points)) => points.push((f.file_offset, 0)),
            None => by_prog.push((prog, what, vec![(f.file_offset, 0)])),
        }
    }
    for (prog, what, points) in by_prog {
        // Said "at N points" when attached.
        let what = what.split(", site").next().unwrap_or(&what).to_string();
        probes.push(Probe::new(what).uprobe_multi(prog, path.clone(), points, pid));
    }
    Ok(probes)
}
