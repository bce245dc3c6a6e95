//! The allocator shim (memtrace/preload/memtrace_preload.c, compiled by
//! build.rs): glibc's allocator calls go through it, and it reports the
//! ones followed at probe sites that start with a nop (emulated by the
//! kernel: no single-step), one site per call, after sampling in the
//! process itself. `memleak -c` preloads it; `memleak -p` and memcg's
//! `--heap` load it into running processes (`injection`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

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

/// Writes the shim where the command can map it executable (content-named,
/// so runs share it and a newer memtrace never loads an older one).
pub fn install() -> Result<PathBuf> {
    let hash = SHIM.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let name = format!("{FILE_PREFIX}{hash:016x}.so");
    let mut tried = Vec::new();
    for dir in ["/run/memtrace", "/var/tmp/memtrace", "/tmp/memtrace"] {
        let dir = Path::new(dir);
        match place(dir, &name) {
            Ok(p) => return Ok(p),
            Err(e) => tried.push(format!("{}: {e}", dir.display())),
        }
    }
    Err(Error::Usage(format!(
        "cannot write the allocator shim ({}): use --no-preload (memleak -c) or --no-inject",
        tried.join("; ")
    )))
}

fn place(dir: &Path, name: &str) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(name);
    if std::fs::read(&path).is_ok_and(|d| d == SHIM) {
        return Ok(path);
    }
    if noexec(dir) {
        return Err(std::io::Error::other("mounted noexec"));
    }
    let tmp = dir.join(format!("{name}.{}", std::process::id()));
    std::fs::write(&tmp, SHIM)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

fn noexec(dir: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return true;
    };
    // SAFETY: a valid path and a statvfs to fill.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    unsafe { libc::statvfs(c.as_ptr(), &mut st) == 0 && st.f_flag & libc::ST_NOEXEC != 0 }
}

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
    let syms = Symbols::open(shim)?;
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
    for (site, prog, what) in wanted {
        let f = syms
            .function(&site)
            .ok_or_else(|| Error::Usage(format!("{}: no function {site}", shim.display())))?;
        probes.push(Probe::new(what).uprobe(prog, path.clone(), f.file_offset, pid));
    }
    Ok(probes)
}
