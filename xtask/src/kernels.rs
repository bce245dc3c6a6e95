//! The kernel matrix (`cargo xtask test --kernels`): memtrace's kprobe and
//! fentry paths, which this host cannot run, on stock Debian 6.1 and 6.12
//! kernels booted under qemu with software emulation (TCG).
//!
//! Everything downloaded is cached under `<target>/kernels/` and reused:
//! qemu and busybox from Debian packages (`apt-get download` + `dpkg-deb -x`,
//! never installed), and one `linux-image` package per series, whose
//! compressed kernel is unpacked to a plain vmlinux once (it boots ~3 s
//! faster under emulation). Each run builds an initramfs (cpio newc, written
//! here) with busybox, the freshly built memtrace and memtrace-workload with
//! their shared libraries, and `tests/guest/init.sh` as `/init`; boots each
//! kernel with a hard timeout, and checks what the guest printed.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::{root, sh, target_dir};

/// Packages qemu needs beyond what this machine has, and busybox for the guest.
const QEMU_PKGS: [&str; 16] = [
    "qemu-system-x86",
    "qemu-system-common",
    "qemu-system-data",
    "seabios",
    "busybox-static",
    "libcapstone4",
    "libfdt1",
    "libpmem1",
    "librdmacm1",
    "libibverbs1",
    "libslirp0",
    "libvdeplug2",
    "libnl-3-200",
    "libnl-route-3-200",
    "libndctl6",
    "libdaxctl1",
];

/// Kernel series and how their package names look.
const SERIES: [&str; 2] = ["6.1", "6.12"];

/// A guest that has not powered off by then is killed and fails.
const BOOT_TIMEOUT: Duration = Duration::from_secs(420);

/// The release number of a stock amd64 image package of `series`, e.g. 56
/// for `linux-image-6.1.0-56-amd64`, 117 for `linux-image-6.12.117+deb12-amd64`
/// (not the cloud, rt, dbg or unsigned flavours).
fn release_of(series: &str, pkg: &str) -> Option<u32> {
    let rest = pkg.strip_suffix("-amd64")?;
    let n = match series {
        "6.1" => rest.strip_prefix("linux-image-6.1.0-")?,
        _ => {
            let (n, tail) = rest
                .strip_prefix(&format!("linux-image-{series}."))?
                .split_once('+')?;
            if tail.contains('-') {
                return None;
            }
            n
        }
    };
    n.parse().ok()
}

struct Kernel {
    series: &'static str,
    /// e.g. `6.1.0-56-amd64`
    name: String,
    /// The uncompressed vmlinux, or the vmlinuz when unpacking failed.
    image: PathBuf,
}

struct Assets {
    qemu_root: PathBuf,
    kernels: Vec<Kernel>,
}

fn apt_get(dir: &Path, args: &[&str]) -> Result<()> {
    let mut c = Command::new("apt-get");
    c.current_dir(dir)
        .args([
            "-q",
            "-o",
            "Acquire::Retries=0",
            "-o",
            "Acquire::http::Timeout=20",
        ])
        .args(["-o", "APT::Sandbox::User=root"])
        .args(args)
        .stdin(Stdio::null());
    let out = c.output().context("running apt-get")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let line = err
            .lines()
            .find(|l| l.starts_with("E:"))
            .or_else(|| err.lines().last())
            .unwrap_or("");
        bail!("apt-get {}: {}", args[0], line.trim());
    }
    Ok(())
}

/// The cached `.deb` of `pkg` in `dir`, downloading it when missing.
fn deb(dir: &Path, pkgs: &[&str]) -> Result<Vec<PathBuf>> {
    let find = |p: &str| -> Option<PathBuf> {
        std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|f| {
                f.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{p}_")) && n.ends_with(".deb"))
            })
    };
    let missing: Vec<&str> = pkgs.iter().copied().filter(|p| find(p).is_none()).collect();
    if !missing.is_empty() {
        eprintln!("xtask: kernels: downloading {}", missing.join(" "));
        apt_get(dir, &[&["download"], &missing[..]].concat())?;
    }
    pkgs.iter()
        .map(|p| find(p).with_context(|| format!("{p}: no .deb after download")))
        .collect()
}

/// Unpacks `deb` into `dest` once (a marker file remembers it).
fn unpack(deb: &Path, dest: &Path) -> Result<()> {
    let marker = dest.join(format!(
        ".unpacked-{}",
        deb.file_name().unwrap().to_string_lossy()
    ));
    if marker.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dest)?;
    sh(Command::new("dpkg-deb").arg("-x").arg(deb).arg(dest))?;
    std::fs::write(marker, "")?;
    Ok(())
}

/// The package to use for `series`: one already unpacked in the cache, else
/// the newest that apt knows (after one `apt-get update` if it knows none).
fn pick_kernel(cache: &Path, series: &str, updated: &mut bool) -> Result<String> {
    let newest = |names: &mut dyn Iterator<Item = String>| {
        names
            .filter_map(|n| release_of(series, &n).map(|r| (r, n)))
            .max()
            .map(|(_, n)| n)
    };
    let mut cached = std::fs::read_dir(cache)?.flatten().filter_map(|e| {
        let n = e.file_name().to_string_lossy().into_owned();
        e.path().join("vmlinuz").exists().then_some(n)
    });
    if let Some(n) = newest(&mut cached) {
        return Ok(n);
    }
    for attempt in 0..2 {
        let out = Command::new("apt-cache")
            .args(["pkgnames", &format!("linux-image-{series}.")])
            .output()
            .context("running apt-cache")?;
        let names = String::from_utf8_lossy(&out.stdout).into_owned();
        if let Some(n) = newest(&mut names.lines().map(str::to_string)) {
            return Ok(n);
        }
        if attempt == 0 && !*updated {
            eprintln!("xtask: kernels: apt knows no {series} kernel; running apt-get update");
            apt_get(Path::new("/"), &["update"])?;
            *updated = true;
        }
    }
    bail!("apt offers no linux-image-{series} amd64 package")
}

/// Writes the kernel inside a bzImage to `out` as a plain ELF vmlinux. The
/// setup header gives the payload (xz or zstd here); its last four bytes
/// hold the uncompressed size.
fn unpack_vmlinux(vmlinuz: &Path, out: &Path) -> Result<()> {
    let b = std::fs::read(vmlinuz)?;
    let le32 = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as usize;
    if b.len() < 0x250 || &b[0x202..0x206] != b"HdrS" {
        bail!("not a bzImage");
    }
    let setup_sects = match b[0x1f1] {
        0 => 4,
        n => n as usize,
    };
    let start = (setup_sects + 1) * 512 + le32(0x248);
    let payload = b
        .get(start..start + le32(0x24c))
        .context("payload past the end")?;
    let size = u32::from_le_bytes(payload[payload.len() - 4..].try_into().unwrap()) as usize;
    let (tool, args, data): (&str, &[&str], &[u8]) = if payload.starts_with(b"\xfd7zXZ\0") {
        ("xz", &["-dc", "--single-stream"], payload)
    } else if payload.starts_with(b"\x28\xb5\x2f\xfd") {
        ("zstd", &["-dcq"], &payload[..payload.len() - 4])
    } else {
        bail!("unknown compression");
    };
    let mut child = Command::new(tool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {tool}"))?;
    let mut stdin = child.stdin.take().unwrap();
    let data = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let mut elf = Vec::with_capacity(size);
    child.stdout.take().unwrap().read_to_end(&mut elf)?;
    let _ = writer.join();
    child.wait()?;
    if !elf.starts_with(b"\x7fELF") || elf.len() != size {
        bail!("{tool} gave {} bytes, expected an ELF of {size}", elf.len());
    }
    let tmp = out.with_extension("tmp");
    std::fs::write(&tmp, &elf)?;
    std::fs::rename(tmp, out)?;
    Ok(())
}

fn fetch(cache: &Path) -> Result<Assets> {
    let debs = cache.join("debs");
    std::fs::create_dir_all(&debs)?;
    let qemu_root = cache.join("qemu");
    for d in deb(&debs, &QEMU_PKGS)? {
        unpack(&d, &qemu_root)?;
    }
    let mut updated = false;
    let mut kernels = Vec::new();
    // MEMTRACE_KERNELS=6.1 boots only that series (comma-separated list).
    let only = std::env::var("MEMTRACE_KERNELS").unwrap_or_default();
    for series in SERIES {
        if !only.is_empty() && !only.split(',').any(|s| s.trim() == series) {
            continue;
        }
        let pkg = pick_kernel(cache, series, &mut updated)?;
        let dir = cache.join(&pkg);
        let vmlinuz = dir.join("vmlinuz");
        if !vmlinuz.exists() {
            let d = deb(&debs, &[&pkg])?.remove(0);
            let tmp = dir.join("deb");
            unpack(&d, &tmp)?;
            let found = std::fs::read_dir(tmp.join("boot"))?
                .flatten()
                .map(|e| e.path())
                .find(|p| {
                    p.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with("vmlinuz-")
                })
                .context("no boot/vmlinuz-* in the package")?;
            std::fs::rename(found, &vmlinuz)?;
            std::fs::remove_dir_all(&tmp)?;
        }
        let vmlinux = dir.join("vmlinux");
        if !vmlinux.exists() {
            if let Err(e) = unpack_vmlinux(&vmlinuz, &vmlinux) {
                eprintln!("xtask: kernels: {pkg}: booting the vmlinuz ({e:#})");
            }
        }
        kernels.push(Kernel {
            series,
            name: pkg.trim_start_matches("linux-image-").to_string(),
            image: if vmlinux.exists() { vmlinux } else { vmlinuz },
        });
    }
    Ok(Assets { qemu_root, kernels })
}

/// A cpio archive in the "newc" format the kernel unpacks as initramfs.
#[derive(Default)]
struct Cpio {
    buf: Vec<u8>,
    ino: u32,
    dirs: BTreeSet<String>,
}

impl Cpio {
    fn entry(&mut self, path: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.ino += 1;
        let name = path.trim_start_matches('/');
        let fields = [
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len() as u32,
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0,
        ];
        self.buf.extend_from_slice(b"070701");
        for f in fields {
            self.buf.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    fn dir(&mut self, path: &str) {
        let path = path.trim_matches('/');
        if path.is_empty() || self.dirs.contains(path) {
            return;
        }
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.dir(parent);
        }
        self.dirs.insert(path.to_string());
        self.entry(path, 0o040755, (0, 0), &[]);
    }

    fn parent(&mut self, path: &str) {
        if let Some((parent, _)) = path.trim_start_matches('/').rsplit_once('/') {
            self.dir(parent);
        }
    }

    fn file(&mut self, path: &str, mode: u32, data: &[u8]) {
        self.parent(path);
        self.entry(path, 0o100000 | mode, (0, 0), data);
    }

    fn symlink(&mut self, path: &str, target: &str) {
        self.parent(path);
        self.entry(path, 0o120777, (0, 0), target.as_bytes());
    }

    fn char_dev(&mut self, path: &str, major: u32, minor: u32) {
        self.parent(path);
        self.entry(path, 0o020600, (major, minor), &[]);
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.buf
    }
}

/// Shared libraries `ldd` lists for `bin` (the dynamic loader included).
fn libs(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .context("running ldd")?;
    let mut v = Vec::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let path = match l.split_once("=>") {
            Some((_, r)) => r.split_whitespace().next(),
            None => l.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            v.push(PathBuf::from(p));
        }
    }
    Ok(v)
}

fn initramfs(qemu_root: &Path, out: &Path) -> Result<()> {
    let release = target_dir().join("release");
    let mut c = Cpio::default();
    for d in ["dev", "proc", "sys", "tmp", "sbin", "usr/bin", "usr/sbin"] {
        c.dir(d);
    }
    c.char_dev("dev/console", 5, 1);
    c.file(
        "bin/busybox",
        0o755,
        &std::fs::read(qemu_root.join("bin/busybox"))?,
    );
    c.symlink("bin/sh", "busybox");
    c.file(
        "init",
        0o755,
        &std::fs::read(root().join("tests/guest/init.sh"))?,
    );
    let mut shared = BTreeSet::new();
    for b in ["memtrace", "memtrace-workload"] {
        let p = release.join(b);
        c.file(
            &format!("bin/{b}"),
            0o755,
            &std::fs::read(&p).with_context(|| format!("{}", p.display()))?,
        );
        shared.extend(libs(&p)?);
    }
    for l in shared {
        // At the path ldd names, with the content of what it links to.
        c.file(&l.to_string_lossy(), 0o755, &std::fs::read(&l)?);
    }
    std::fs::write(out, c.finish())?;
    Ok(())
}

/// What one guest printed, by case.
#[derive(Default)]
struct Guest {
    info: String,
    out: BTreeMap<String, Vec<String>>,
    err: BTreeMap<String, Vec<String>>,
    cases: BTreeMap<String, BTreeMap<String, i64>>,
    end: Option<String>,
    console: String,
    wall: Duration,
}

fn parse(console: &str) -> Guest {
    let mut g = Guest {
        console: console.to_string(),
        ..Default::default()
    };
    for line in console.lines() {
        let line = line.trim_end_matches('\r');
        let Some(i) = line.find("MT-") else { continue };
        let line = &line[i..];
        let (tag, rest) = line.split_once(' ').unwrap_or((line, ""));
        let (case, body) = rest.split_once(' ').unwrap_or((rest, ""));
        match tag {
            "MT-INFO" => g.info = rest.to_string(),
            "MT-OUT" => g.out.entry(case.into()).or_default().push(body.into()),
            "MT-ERR" => g.err.entry(case.into()).or_default().push(body.into()),
            "MT-CASE" => {
                let kv = body
                    .split_whitespace()
                    .filter_map(|f| f.split_once('='))
                    .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
                    .collect();
                g.cases.insert(case.into(), kv);
            }
            "MT-END" => g.end = Some(case.to_string()),
            _ => {}
        }
    }
    g
}

fn boot(assets: &Assets, k: &Kernel, initrd: &Path) -> Result<Guest> {
    let q = &assets.qemu_root;
    let libdirs = std::env::join_paths([
        q.join("usr/lib/x86_64-linux-gnu"),
        q.join("lib/x86_64-linux-gnu"),
    ])?;
    let mut child = Command::new(q.join("usr/bin/qemu-system-x86_64"))
        .env("LD_LIBRARY_PATH", &libdirs)
        .arg("-L")
        .arg(q.join("usr/share/qemu"))
        .arg("-L")
        .arg(q.join("usr/share/seabios"))
        .args(["-accel", "tcg", "-cpu", "max", "-m", "512", "-smp", "2"])
        .args(["-nographic", "-no-reboot", "-nic", "none"])
        .arg("-kernel")
        .arg(&k.image)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", "console=ttyS0 panic=-1 quiet"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting qemu")?;
    let t0 = Instant::now();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        for l in BufReader::new(stdout).split(b'\n').map_while(|l| l.ok()) {
            s.push_str(&String::from_utf8_lossy(&l));
            s.push('\n');
        }
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut s);
        s
    });
    let mut timed_out = false;
    while child.try_wait()?.is_none() {
        if t0.elapsed() > BOOT_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            timed_out = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let wall = t0.elapsed();
    let mut console = reader.join().unwrap_or_default();
    let qerr = err_reader.join().unwrap_or_default();
    if !qerr.trim().is_empty() {
        console.push_str(&format!("[qemu stderr] {qerr}"));
    }
    if timed_out {
        console.push_str(&format!("[xtask] killed after {BOOT_TIMEOUT:?}\n"));
    }
    let mut g = parse(&console);
    g.wall = wall;
    Ok(g)
}

/// One row of the summary: a check on one kernel.
struct Row {
    kernel: String,
    case: String,
    method: String,
    ok: bool,
    ms: i64,
    why: Vec<String>,
}

fn json(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

fn of_type<'a>(v: &'a [Value], ty: &str) -> Vec<&'a Value> {
    v.iter().filter(|x| x["type"] == ty).collect()
}

/// The attach method of the tool's main probe, from the JSON summary.
fn summary_method(v: &[Value], probe: &str) -> String {
    of_type(v, "summary")
        .first()
        .and_then(|s| s["attached"].as_array())
        .and_then(|a| a.iter().find(|p| p["probe"] == probe))
        .and_then(|p| p["method"].as_str())
        .unwrap_or("-")
        .to_string()
}

/// Checks one case's output; returns the method it used and what was wrong.
fn check(g: &Guest, case: &str) -> (String, Vec<String>) {
    let mut why = Vec::new();
    let empty = Vec::new();
    let out = g.out.get(case).unwrap_or(&empty);
    let Some(st) = g.cases.get(case) else {
        return ("-".into(), vec!["did not run".into()]);
    };
    let rc = st.get("rc").copied().unwrap_or(-1);
    if rc != 0 {
        why.push(format!("memtrace exited with {rc}"));
    }
    let v = json(out);
    let probe = match case {
        "faults" => "user page faults",
        "brkstack" => "brk calls",
        "drsnoop" => "memcg reclaim end",
        _ => "oom kill",
    };
    let mut method = summary_method(&v, probe);
    match case {
        "doctor" => {
            // FEATURE OK DETAIL rows, and TOOL PROBE METHOD TARGET rows.
            let ok = |feature: &str| {
                out.iter().any(|l| {
                    l.strip_prefix(feature)
                        .is_some_and(|r| r.split_whitespace().next() == Some("yes"))
                })
            };
            for f in ["kprobe pmu", "fentry "] {
                if !ok(f) {
                    why.push(format!("doctor: {} not available", f.trim()));
                }
            }
            method = out
                .iter()
                .find(|l| l.starts_with("oomkill "))
                .and_then(|l| l.split_whitespace().nth(3))
                .unwrap_or("-")
                .to_string();
            let avail: Vec<&str> = ["kprobe pmu", "fentry "]
                .iter()
                .filter(|f| ok(f))
                .map(|f| f.split(' ').next().unwrap())
                .collect();
            if !avail.is_empty() {
                method = format!("{} (oomkill: {method})", avail.join("+"));
            }
        }
        c if c.starts_with("oom-") => {
            let want = match &c[4..] {
                "best" => "kprobe",
                m => m,
            };
            if method != want {
                why.push(format!("attached by {method}, expected {want}"));
            }
            let wpid = st.get("wpid").copied().unwrap_or(0);
            if st.get("wrc") != Some(&137) {
                why.push(format!("workload not OOM-killed: {:?}", st.get("wrc")));
            }
            let kills: Vec<_> = of_type(&v, "oom_kill")
                .into_iter()
                .filter(|k| k["victim_pid"] == wpid)
                .collect();
            if kills.len() != 1 {
                why.push(format!("{} kills of {wpid} reported", kills.len()));
            }
            if let Some(k) = kills.first() {
                let mut expect = |field: &str, want: Value| {
                    if k[field] != want {
                        why.push(format!("{field} {} != {want}", k[field]));
                    }
                };
                expect("victim_comm", "memtrace-worklo".into());
                expect("memcg", format!("/mt-{c}").into());
                // A 64 MiB limit in 4 KiB pages, from oom_control where the
                // method sees it (kprobe, fentry), else from the memcg limit.
                expect("pages", 16384.into());
                let source = if matches!(want, "kprobe" | "fentry") {
                    "oom_control"
                } else {
                    "memcg_limit"
                };
                expect("pages_source", source.into());
                expect("method", want.into());
                if k["anon_rss_kb"].as_u64().unwrap_or(0) <= 32 * 1024 {
                    why.push(format!("anon_rss_kb {} too small", k["anon_rss_kb"]));
                }
            }
        }
        "faults" => {
            let user: u64 = of_type(&v, "faults")
                .iter()
                .map(|r| r["user"].as_u64().unwrap_or(0))
                .sum();
            if user < 2000 {
                why.push(format!("{user} user faults < 2000"));
            }
        }
        "drsnoop" => {
            // The kernel reclaims in the memcg before it kills: stalls of the
            // workload, memcg kind, in its cgroup.
            let wpid = st.get("wpid").copied().unwrap_or(0);
            if st.get("wrc") != Some(&137) {
                why.push(format!("workload not OOM-killed: {:?}", st.get("wrc")));
            }
            let stalls: Vec<_> = of_type(&v, "reclaim_stall")
                .into_iter()
                .filter(|s| s["pid"] == wpid)
                .collect();
            if stalls.is_empty() {
                why.push(format!("no reclaim stall of {wpid}"));
            }
            if !stalls
                .iter()
                .all(|s| s["kind"] == "memcg" && s["memcg"] == "/mt-drsnoop")
            {
                why.push(format!("stalls not in /mt-drsnoop: {stalls:?}"));
            }
        }
        "brkstack" => {
            let hit = of_type(&v, "brk_stack")
                .iter()
                .any(|s| s["count"] == 50 && s["bytes"] == 204800);
            if !hit {
                why.push("no brk stack with count 50 and 204800 bytes".into());
            }
        }
        _ => {}
    }
    if case != "doctor" {
        let lost = of_type(&v, "summary")
            .first()
            .map(|s| s["lost_total"].clone());
        if lost != Some(0.into()) {
            why.push(format!("lost_total {lost:?}"));
        }
    }
    (method, why)
}

const CASES: [&str; 8] = [
    "doctor",
    "oom-best",
    "oom-fentry",
    "oom-tp_btf",
    "oom-tracepoint",
    "drsnoop",
    "faults",
    "brkstack",
];

/// Runs the matrix. When `required` is false, kernels that cannot be
/// fetched (no network to the Debian mirror, no apt) skip it with one line.
pub fn run(required: bool) -> Result<()> {
    let t0 = Instant::now();
    let cache = target_dir().join("kernels");
    std::fs::create_dir_all(&cache)?;
    let assets = match fetch(&cache) {
        Ok(a) => a,
        Err(e) if !required => {
            eprintln!("xtask: kernel matrix skipped: cannot fetch the kernels or qemu: {e:#}");
            return Ok(());
        }
        Err(e) => return Err(e.context("fetching the kernels and qemu")),
    };
    let initrd = cache.join("initrd.cpio");
    initramfs(&assets.qemu_root, &initrd)?;
    eprintln!(
        "xtask: kernels: booting {} under qemu (TCG)",
        assets
            .kernels
            .iter()
            .map(|k| k.name.as_str())
            .collect::<Vec<_>>()
            .join(" and ")
    );
    let guests: Vec<Result<Guest>> = std::thread::scope(|s| {
        let hs: Vec<_> = assets
            .kernels
            .iter()
            .map(|k| s.spawn(|| boot(&assets, k, &initrd)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut rows = Vec::new();
    let mut failed = false;
    let logs = cache.join("logs");
    std::fs::create_dir_all(&logs)?;
    for (k, g) in assets.kernels.iter().zip(guests) {
        let g = g?;
        let log = logs.join(format!("{}.log", k.name));
        std::fs::write(&log, &g.console)?;
        let end_ok = g.end.as_deref() == Some("PASS");
        for case in CASES {
            let (method, why) = check(&g, case);
            rows.push(Row {
                kernel: format!("{} ({})", k.series, k.name),
                case: case.to_string(),
                method,
                ok: why.is_empty(),
                ms: g
                    .cases
                    .get(case)
                    .and_then(|c| c.get("ms"))
                    .copied()
                    .unwrap_or(-1),
                why,
            });
        }
        let bad = rows.iter().any(|r| !r.ok && r.kernel.contains(&k.name));
        eprintln!(
            "xtask: kernels: {}: {} [{}], guest {} in {:.1}s, console log {}",
            k.name,
            if bad || !end_ok { "FAIL" } else { "PASS" },
            g.info,
            g.end.as_deref().unwrap_or("never finished"),
            g.wall.as_secs_f64(),
            log.display()
        );
        failed |= bad || !end_ok;
    }
    println!();
    println!(
        "{:<28} {:<15} {:<34} {:<6} {:>7}",
        "KERNEL", "CHECK", "ATTACH METHOD", "RESULT", "TIME"
    );
    for r in &rows {
        println!(
            "{:<28} {:<15} {:<34} {:<6} {:>6.1}s",
            r.kernel,
            r.case,
            r.method,
            if r.ok { "pass" } else { "FAIL" },
            r.ms as f64 / 1000.0
        );
        for w in &r.why {
            println!("    {w}");
        }
    }
    println!(
        "kernel matrix: {:.0}s wall (guests run in parallel)",
        t0.elapsed().as_secs_f64()
    );
    if failed {
        bail!("kernel matrix failed (console logs in {})", logs.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_stock_amd64_images_only() {
        assert_eq!(release_of("6.1", "linux-image-6.1.0-56-amd64"), Some(56));
        assert_eq!(release_of("6.1", "linux-image-6.1.0-56-cloud-amd64"), None);
        assert_eq!(
            release_of("6.12", "linux-image-6.12.117+deb12-amd64"),
            Some(117)
        );
        assert_eq!(
            release_of("6.12", "linux-image-6.12.117+deb12-rt-amd64"),
            None
        );
        assert_eq!(release_of("6.1", "linux-image-6.12.117+deb12-amd64"), None);
    }

    #[test]
    fn parses_guest_lines() {
        let g = parse(
            "noise\r\nMT-INFO kernel=6.1 cgroup=v1\r\nMT-OUT faults {\"a\":1}\n\
             [  1.0] MT-CASE faults rc=0 wrc=0 wpid=0 ms=1234\nMT-END PASS\n",
        );
        assert_eq!(g.info, "kernel=6.1 cgroup=v1");
        assert_eq!(g.out["faults"], ["{\"a\":1}"]);
        assert_eq!(g.cases["faults"]["ms"], 1234);
        assert_eq!(g.end.as_deref(), Some("PASS"));
    }
}
