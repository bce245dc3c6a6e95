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

/// Series whose kernels have both cgroup versions: each also boots a guest
/// with v1's memory controller off, which runs every case on cgroup v2.
/// Booted by default; when MEMTRACE_KERNELS is set, only if it names
/// `cgroup2` too.
const BOTH_CGROUPS: [&str; 2] = ["5.10", "6.1"];
/// Guests booted at once: each is one emulator thread, at the lowest
/// priority beside the host's tests on this machine's two cores; more at
/// once made the guests' timed cases flaky.
const GUESTS_AT_ONCE: usize = 4;

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

/// Whether this run boots `series`'s cgroup v2 guest (`BOTH_CGROUPS`).
fn cgroup2_wanted(series: &str) -> bool {
    let only = std::env::var("MEMTRACE_KERNELS").unwrap_or_default();
    BOTH_CGROUPS.contains(&series)
        && (only.is_empty() || only.split(',').any(|s| s.trim() == "cgroup2"))
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

/// One guest: a kernel, booted on cgroup v2 where it would take v1.
struct Boot<'a> {
    k: &'a Kernel,
    cgroup2: bool,
}

impl Boot<'_> {
    /// Its name in logs and the summary.
    fn label(&self) -> String {
        match self.cgroup2 {
            true => format!("{}+cgroup2", self.k.name),
            false => self.k.name.clone(),
        }
    }

    /// What its kernel command line adds (PSI is off by default in
    /// Debian's kernels; the v2 cases need it).
    fn cmdline(&self) -> &'static str {
        match self.cgroup2 {
            true => " cgroup_no_v1=memory psi=1",
            false => "",
        }
    }
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
    b: &Boot,
    initrd: &std::path::Path,
    cache: &std::path::Path,
) -> Result<check::Guest> {
    let g = boot::boot(assets, b, initrd)?;
    if g.end.is_some() || !g.console.contains("Oops: int3") {
        return Ok(g);
    }
    eprintln!(
        "xtask: kernels: {}: the guest kernel died with `Oops: int3` (live code patching under \
         TCG, an emulator flake); booting it once more",
        b.label()
    );
    let logs = cache.join("logs");
    std::fs::create_dir_all(&logs)?;
    std::fs::write(logs.join(format!("{}.crashed.log", b.label())), &g.console)?;
    boot::boot(assets, b, initrd)
}

/// Boots every guest, `GUESTS_AT_ONCE` at a time; their results in order.
fn boot_all(
    assets: &Assets,
    boots: &[Boot],
    initrds: &std::collections::BTreeMap<&str, PathBuf>,
    cache: &std::path::Path,
) -> Vec<Result<check::Guest>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done: Vec<std::sync::Mutex<Option<Result<check::Guest>>>> =
        boots.iter().map(|_| Default::default()).collect();
    std::thread::scope(|s| {
        for _ in 0..GUESTS_AT_ONCE.min(boots.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(b) = boots.get(i) else { break };
                let g = boot_retrying_emulator_crash(assets, b, &initrds[b.k.arch.deb()], cache);
                *done[i].lock().unwrap() = Some(g);
            });
        }
    });
    done.into_iter()
        .map(|m| m.into_inner().unwrap().expect("every guest booted"))
        .collect()
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
    let boots: Vec<Boot> = assets
        .kernels
        .iter()
        .map(|k| Boot { k, cgroup2: false })
        .chain(
            assets
                .kernels
                .iter()
                .filter(|k| k.arch == arch::Arch::X86_64 && cgroup2_wanted(k.series))
                .map(|k| Boot { k, cgroup2: true }),
        )
        .collect();
    eprintln!(
        "xtask: kernels: booting {} under qemu (TCG), {GUESTS_AT_ONCE} at once",
        boots
            .iter()
            .map(Boot::label)
            .collect::<Vec<_>>()
            .join(" and ")
    );
    let guests = boot_all(&assets, &boots, &initrds, &cache);
    let mut rows = Vec::new();
    let mut lines = Vec::new();
    let mut failed = false;
    let logs = cache.join("logs");
    std::fs::create_dir_all(&logs)?;
    for (b, g) in boots.iter().zip(guests) {
        let g = g?;
        let log = logs.join(format!("{}.log", b.label()));
        std::fs::write(&log, &g.console)?;
        let end_ok = g.end.as_deref() == Some("PASS");
        let checked = check::check_all(&g);
        let bad = checked.iter().any(|c| !c.why.is_empty());
        let series = match b.cgroup2 {
            true => format!("{}+cgroup2", b.k.series),
            false => b.k.series.to_string(),
        };
        for c in checked {
            rows.push(Row {
                kernel: format!("{series} ({})", b.k.name),
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
        lines.push(format!(
            "xtask: kernels: {}: {} [{}], guest {} in {:.1}s, console log {}",
            b.label(),
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
        "kernel matrix: {:.0}s wall ({GUESTS_AT_ONCE} guests at once)",
        wall.as_secs_f64()
    );
    if failed {
        bail!("kernel matrix failed (console logs in {})", logs.display());
    }
    Ok(())
}
