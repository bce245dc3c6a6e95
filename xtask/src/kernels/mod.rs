//! The kernel matrix (`cargo xtask test --kernels`): memtrace's kprobe and
//! fentry paths, which this host cannot run, on stock Debian 5.10, 6.1 and
//! 6.12 kernels booted under qemu with software emulation (TCG), and on
//! Debian's arm64 6.12 with memtrace cross-built for it (`cross.rs`).
//!
//! Everything downloaded is cached under `<target>/kernels/` and reused:
//! qemu and busybox from Debian packages (`apt-get download` + `dpkg-deb -x`,
//! never installed), and one `linux-image` package per series, whose
//! compressed kernel is unpacked to a plain vmlinux once (it boots ~3 s
//! faster under emulation). Each run builds an initramfs (cpio newc, written
//! here) with busybox, the freshly built memtrace and memtrace-workload with
//! their shared libraries, and `tests/guest/init.sh` as `/init`; boots each
//! kernel with a hard timeout, and checks what the guest printed.

mod arch;
mod boot;
mod check;
mod cross;
mod doctor;
mod fetch;
mod initramfs;
mod live;
mod memcg;
mod modules;
mod replay;
mod snoop;
mod tools;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{bail, Result};

use crate::target_dir;

/// Kernel series booted by default. 5.10 (Debian bullseye's, fetched
/// through an apt configuration of its own, `fetch::Archive`) runs every
/// case on memtrace's compat object.
const SERIES: [&str; 3] = ["5.10", "6.1", "6.12"];
/// Series booted only when MEMTRACE_KERNELS names them.
const OPT_IN: [&str; 0] = [];
/// arm64 series, booted by default (`arm64` in MEMTRACE_KERNELS).
const ARM64_SERIES: [&str; 1] = ["6.12"];

/// Whether this run boots `series` on `arch`: MEMTRACE_KERNELS=6.1 boots
/// only that series (a comma-separated list; `arm64` names arm64's); it
/// also names series not booted by default.
fn wanted(series: &str, arch: arch::Arch) -> bool {
    let only = std::env::var("MEMTRACE_KERNELS").unwrap_or_default();
    if only.is_empty() {
        return !OPT_IN.contains(&series) || arch == arch::Arch::Arm64;
    }
    let name = match arch {
        arch::Arch::X86_64 => series,
        arch::Arch::Arm64 => "arm64",
    };
    only.split(',').any(|s| s.trim() == name)
}

/// Whether this run built the arm64 binaries (`build_arm64`).
static ARM64_BUILT: AtomicBool = AtomicBool::new(false);

/// Builds memtrace for the arm64 guest, when this run boots it: before
/// the host's tests start, so that no compiler runs beside them. Without
/// a cross gcc the arm64 guest is skipped (said); a failed build is an
/// error.
pub fn build_arm64() -> Result<()> {
    if ARM64_SERIES.iter().any(|s| wanted(s, arch::Arch::Arm64)) {
        ARM64_BUILT.store(cross::build()?, Ordering::Relaxed);
    }
    Ok(())
}

struct Kernel {
    series: &'static str,
    arch: arch::Arch,
    /// e.g. `6.1.0-56-amd64`
    name: String,
    /// The uncompressed vmlinux, or the vmlinuz when unpacking failed.
    image: PathBuf,
    /// Modules for the guest (`modules.rs`), with their load `order`.
    modules: PathBuf,
}

struct Assets {
    qemu_root: PathBuf,
    /// busybox for arm64 (`bin/busybox`).
    arm64_root: PathBuf,
    kernels: Vec<Kernel>,
    /// Series that could not be fetched, and why.
    unfetched: Vec<(&'static str, anyhow::Error)>,
}

/// One row of the summary: a check on one kernel.
struct Row {
    kernel: String,
    case: String,
    method: String,
    ok: bool,
    /// Not run on this kernel, and why.
    skip: Option<String>,
    ms: i64,
    why: Vec<String>,
}

/// Runs the matrix. When `required` is false, kernels that cannot be
/// fetched (no network to the Debian mirror, no apt) skip it with one line.
/// Boots a guest, and once more if its kernel died at live code patching:
/// under TCG a CPU can still execute a patched-out `int3` (`Oops: int3`,
/// seen at tracepoint and page-fault entry as memtrace enables a
/// tracepoint), which is the emulator's, not memtrace's. The crashed run's
/// console is kept beside the log, and the retry is said.
fn boot_retrying_emulator_crash(
    assets: &Assets,
    k: &Kernel,
    initrd: &std::path::Path,
    cache: &std::path::Path,
) -> Result<check::Guest> {
    let g = boot::boot(assets, k, initrd)?;
    if g.end.is_some() || !g.console.contains("Oops: int3") {
        return Ok(g);
    }
    eprintln!(
        "xtask: kernels: {}: the guest kernel died with `Oops: int3` (live code patching under \
         TCG, an emulator flake); booting it once more",
        k.name
    );
    let logs = cache.join("logs");
    std::fs::create_dir_all(&logs)?;
    std::fs::write(logs.join(format!("{}.crashed.log", k.name)), &g.console)?;
    boot::boot(assets, k, initrd)
}

/// Fetches the kernels and qemu into the cache on a thread of its own, so
/// that a fresh clone downloads them (about 20 s here) while it builds;
/// `run` finds them there, or fetches again and says why it cannot.
pub fn prefetch() -> std::thread::JoinHandle<()> {
    std::thread::spawn(|| {
        let cache = target_dir().join("kernels");
        if std::fs::create_dir_all(&cache).is_ok() {
            let _ = fetch::fetch(&cache);
        }
    })
}

/// What the matrix found, printed by `report`: apart from the run so that
/// it can run beside the host's tests and print after them.
pub struct Outcome {
    /// One line per kernel: passed or not, where its console log is.
    lines: Vec<String>,
    rows: Vec<Row>,
    failed: bool,
    wall: std::time::Duration,
    logs: PathBuf,
}

/// Runs the matrix and prints what it found.
pub fn run(required: bool) -> Result<()> {
    report(matrix(required)?)
}

/// Boots every kernel and checks what its guest printed. `None`: skipped
/// (said on stderr), when `required` is false and the kernels or qemu
/// cannot be fetched.
pub fn matrix(required: bool) -> Result<Option<Outcome>> {
    let t0 = Instant::now();
    let cache = target_dir().join("kernels");
    std::fs::create_dir_all(&cache)?;
    let mut assets = match fetch::fetch(&cache) {
        Ok(a) => a,
        Err(e) if !required => {
            eprintln!("xtask: kernel matrix skipped: cannot fetch the kernels or qemu: {e:#}");
            return Ok(None);
        }
        Err(e) => return Err(e.context("fetching the kernels and qemu")),
    };
    // A series whose archive is out of reach (bullseye's may be dropped)
    // is skipped with a line unless the matrix is required.
    for (series, e) in &assets.unfetched {
        if required {
            bail!("cannot fetch the {series} kernel: {e:#}");
        }
        eprintln!("xtask: kernels: {series} skipped: cannot fetch its kernel: {e:#}");
    }
    if !ARM64_BUILT.load(Ordering::Relaxed)
        && assets.kernels.iter().any(|k| k.arch == arch::Arch::Arm64)
    {
        if required {
            bail!("the arm64 guest needs memtrace built for arm64, and it could not be");
        }
        eprintln!("xtask: kernels: arm64 skipped: memtrace was not built for it");
        assets.kernels.retain(|k| k.arch != arch::Arch::Arm64);
    }
    if assets.kernels.is_empty() {
        eprintln!("xtask: kernel matrix skipped: no kernel could be fetched");
        return Ok(None);
    }
    // One initramfs per architecture, with that architecture's binaries.
    let mut initrds = std::collections::BTreeMap::new();
    for k in &assets.kernels {
        if !initrds.contains_key(k.arch.deb()) {
            let initrd = cache.join(format!("initrd-{}.cpio", k.arch.deb()));
            initramfs::initramfs(&assets, k.arch, &initrd)?;
            initrds.insert(k.arch.deb(), initrd);
        }
    }
    eprintln!(
        "xtask: kernels: booting {} under qemu (TCG)",
        assets
            .kernels
            .iter()
            .map(|k| k.name.as_str())
            .collect::<Vec<_>>()
            .join(" and ")
    );
    let guests: Vec<Result<check::Guest>> = std::thread::scope(|s| {
        let hs: Vec<_> = assets
            .kernels
            .iter()
            .map(|k| {
                let (assets, initrd, cache) = (&assets, &initrds[k.arch.deb()], &cache);
                s.spawn(move || boot_retrying_emulator_crash(assets, k, initrd, cache))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut rows = Vec::new();
    let mut lines = Vec::new();
    let mut failed = false;
    let logs = cache.join("logs");
    std::fs::create_dir_all(&logs)?;
    for (k, g) in assets.kernels.iter().zip(guests) {
        let g = g?;
        let log = logs.join(format!("{}.log", k.name));
        std::fs::write(&log, &g.console)?;
        let end_ok = g.end.as_deref() == Some("PASS");
        for c in check::check_all(&g) {
            rows.push(Row {
                kernel: format!("{} ({})", k.series, k.name),
                case: c.case.name.to_string(),
                method: c.method,
                ok: c.why.is_empty(),
                skip: c.skip,
                ms: g
                    .cases
                    .get(c.case.name)
                    .and_then(|s| s.get("ms"))
                    .copied()
                    .unwrap_or(-1),
                why: c.why,
            });
        }
        let bad = rows.iter().any(|r| !r.ok && r.kernel.contains(&k.name));
        lines.push(format!(
            "xtask: kernels: {}: {} [{}], guest {} in {:.1}s, console log {}",
            k.name,
            if bad || !end_ok { "FAIL" } else { "PASS" },
            g.info,
            g.end.as_deref().unwrap_or("never finished"),
            g.wall.as_secs_f64(),
            log.display()
        ));
        failed |= bad || !end_ok;
    }
    Ok(Some(Outcome {
        lines,
        rows,
        failed,
        wall: t0.elapsed(),
        logs,
    }))
}

/// Prints the matrix's table; an error when a check failed.
pub fn report(outcome: Option<Outcome>) -> Result<()> {
    let Some(Outcome {
        lines,
        rows,
        failed,
        wall,
        logs,
    }) = outcome
    else {
        return Ok(());
    };
    for l in &lines {
        eprintln!("{l}");
    }
    println!();
    println!(
        "{:<28} {:<15} {:<34} {:<6} {:>7}",
        "KERNEL", "CHECK", "ATTACH METHOD", "RESULT", "TIME"
    );
    for r in &rows {
        let (result, time) = match (&r.skip, r.ok) {
            (Some(_), _) => ("skip", "-".to_string()),
            (None, ok) => (
                if ok { "pass" } else { "FAIL" },
                format!("{:.1}s", r.ms as f64 / 1000.0),
            ),
        };
        println!(
            "{:<28} {:<15} {:<34} {:<6} {:>7}",
            r.kernel, r.case, r.method, result, time
        );
        if let Some(s) = &r.skip {
            println!("    skipped: {s}");
        }
        for w in &r.why {
            println!("    {w}");
        }
    }
    println!(
        "kernel matrix: {:.0}s wall (guests run in parallel)",
        wall.as_secs_f64()
    );
    if failed {
        bail!("kernel matrix failed (console logs in {})", logs.display());
    }
    Ok(())
}
