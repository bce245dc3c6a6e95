//! Fetching and caching what the matrix boots: qemu and busybox from Debian
//! packages (`apt-get download` + `dpkg-deb -x`, never installed) and one
//! `linux-image` package per series, whose kernel is unpacked to a plain
//! vmlinux once (it boots about 3 s faster under emulation). arm64's come
//! from Debian's arm64 archive (an apt configuration of its own), with a
//! busybox of that architecture for its guest.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use super::arch::Arch;
use super::{Assets, Kernel, ARM64_SERIES, OPT_IN, SERIES};
use crate::sh;

/// Packages qemu needs beyond what this machine has, and busybox for the
/// x86-64 guests.
const QEMU_PKGS: [&str; 17] = [
    "qemu-system-x86",
    "qemu-system-arm",
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

/// The release number of a stock image package of `series` for `arch`,
/// e.g. 56 for `linux-image-6.1.0-56-amd64`, 117 for
/// `linux-image-6.12.117+deb12-arm64` (not the cloud, rt, dbg or unsigned
/// flavours).
fn release_of(series: &str, arch: Arch, pkg: &str) -> Option<u32> {
    let rest = pkg.strip_suffix(&format!("-{}", arch.deb()))?;
    let n = match series {
        "5.10" => rest.strip_prefix("linux-image-5.10.0-")?,
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

/// Where a series' packages come from: the host's apt sources, or an
/// archive of another release (bullseye for 5.10) or architecture (arm64,
/// bookworm's) through options that point apt at a sources list and
/// package lists under the cache.
#[derive(Clone, Default)]
struct Archive(Vec<String>);

impl Archive {
    fn of(series: &str, arch: Arch, cache: &Path) -> Result<Archive> {
        let (suite, name) = match (series, arch) {
            (_, Arch::Arm64) => ("bookworm", "arm64".to_string()),
            ("5.10", _) => ("bullseye", "bullseye".to_string()),
            _ => return Ok(Archive::default()),
        };
        let dir = cache.join(format!("apt-{name}"));
        std::fs::create_dir_all(dir.join("lists/partial"))?;
        std::fs::create_dir_all(dir.join("archives/partial"))?;
        let list = dir.join("sources.list");
        let key = "/usr/share/keyrings/debian-archive-keyring.gpg";
        let opts = format!("arch={} signed-by={key}", arch.deb());
        std::fs::write(
            &list,
            format!(
                "deb [{opts}] http://deb.debian.org/debian {suite} main\n\
                 deb [{opts}] http://deb.debian.org/debian-security {suite}-security main\n"
            ),
        )?;
        let mut a = Archive(vec![
            "-o".into(),
            format!("Dir::Etc::sourcelist={}", list.display()),
            "-o".into(),
            "Dir::Etc::sourceparts=-".into(),
            "-o".into(),
            format!("Dir::State::Lists={}", dir.join("lists").display()),
            "-o".into(),
            format!("Dir::Cache={}", dir.display()),
        ]);
        if arch == Arch::Arm64 {
            for o in ["APT::Architectures::=arm64", "APT::Architecture=arm64"] {
                a.0.extend(["-o".into(), o.into()]);
            }
        }
        let fetched = std::fs::read_dir(dir.join("lists"))?
            .flatten()
            // Kept compressed (`_Packages.lz4`).
            .any(|e| e.file_name().to_string_lossy().contains("_Packages"));
        if !fetched {
            eprintln!("xtask: kernels: fetching {name}'s package lists");
            apt_get(&a, Path::new("/"), &["update"])?;
        }
        Ok(a)
    }
}

fn apt_get(archive: &Archive, dir: &Path, args: &[&str]) -> Result<()> {
    let mut c = Command::new("apt-get");
    c.current_dir(dir)
        .args(&archive.0)
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
fn deb(archive: &Archive, dir: &Path, pkgs: &[&str]) -> Result<Vec<PathBuf>> {
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
        apt_get(archive, dir, &[&["download"], &missing[..]].concat())?;
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
fn pick_kernel(
    archive: &Archive,
    cache: &Path,
    (series, arch): (&str, Arch),
    updated: &mut bool,
) -> Result<String> {
    let newest = |names: &mut dyn Iterator<Item = String>| {
        names
            .filter_map(|n| release_of(series, arch, &n).map(|r| (r, n)))
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
            .args(&archive.0)
            .args(["pkgnames", &format!("linux-image-{series}.")])
            .output()
            .context("running apt-cache")?;
        let names = String::from_utf8_lossy(&out.stdout).into_owned();
        if let Some(n) = newest(&mut names.lines().map(str::to_string)) {
            return Ok(n);
        }
        if attempt == 0 && !*updated {
            eprintln!("xtask: kernels: apt knows no {series} kernel; running apt-get update");
            apt_get(archive, Path::new("/"), &["update"])?;
            *updated = true;
        }
    }
    bail!("apt offers no linux-image-{series} {} package", arch.deb())
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

pub(super) fn fetch(cache: &Path) -> Result<Assets> {
    let debs = cache.join("debs");
    std::fs::create_dir_all(&debs)?;
    let qemu_root = cache.join("qemu");
    for d in deb(&Archive::default(), &debs, &QEMU_PKGS)? {
        unpack(&d, &qemu_root)?;
    }
    let mut updated = false;
    let mut kernels = Vec::new();
    let mut unfetched = Vec::new();
    let x86 = SERIES.into_iter().chain(OPT_IN).map(|s| (s, Arch::X86_64));
    let arm64 = ARM64_SERIES.into_iter().map(|s| (s, Arch::Arm64));
    for (series, arch) in x86.chain(arm64).filter(|&(s, a)| super::wanted(s, a)) {
        match kernel(cache, &debs, (series, arch), &mut updated) {
            Ok(k) => kernels.push(k),
            Err(e) => unfetched.push((series, e)),
        }
    }
    let arm64_root = cache.join("arm64-root");
    if kernels.iter().any(|k| k.arch == Arch::Arm64) {
        let archive = Archive::of("", Arch::Arm64, cache)?;
        let arm64_debs = cache.join("debs-arm64");
        std::fs::create_dir_all(&arm64_debs)?;
        for d in deb(&archive, &arm64_debs, &["busybox-static"])? {
            unpack(&d, &arm64_root)?;
        }
    }
    Ok(Assets {
        qemu_root,
        arm64_root,
        kernels,
        unfetched,
    })
}

/// One series' newest stock kernel, unpacked into the cache.
fn kernel(
    cache: &Path,
    debs: &Path,
    (series, arch): (&'static str, Arch),
    updated: &mut bool,
) -> Result<Kernel> {
    {
        let archive = Archive::of(series, arch, cache)?;
        let pkg = pick_kernel(&archive, cache, (series, arch), updated)?;
        let dir = cache.join(&pkg);
        let vmlinuz = dir.join("vmlinuz");
        if !vmlinuz.exists() {
            let d = deb(&archive, debs, &[&pkg])?.remove(0);
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
        // arm64's vmlinuz is an uncompressed Image already.
        let vmlinux = dir.join("vmlinux");
        if !vmlinux.exists() && arch == Arch::X86_64 {
            if let Err(e) = unpack_vmlinux(&vmlinuz, &vmlinux) {
                eprintln!("xtask: kernels: {pkg}: booting the vmlinuz ({e:#})");
            }
        }
        let modules = dir.join("modules");
        if !modules.join("order").exists() {
            let d = deb(&archive, debs, &[&pkg])?.remove(0);
            super::modules::extract(&d, &modules)
                .with_context(|| format!("{pkg}: taking zram out of the package"))?;
        }
        Ok(Kernel {
            series,
            arch,
            name: pkg.trim_start_matches("linux-image-").to_string(),
            image: if vmlinux.exists() { vmlinux } else { vmlinuz },
            modules,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_stock_amd64_images_only() {
        assert_eq!(
            release_of("6.1", Arch::X86_64, "linux-image-6.1.0-56-amd64"),
            Some(56)
        );
        assert_eq!(
            release_of("5.10", Arch::X86_64, "linux-image-5.10.0-46-amd64"),
            Some(46)
        );
        assert_eq!(
            release_of("5.10", Arch::X86_64, "linux-image-5.10.0-46-rt-amd64"),
            None
        );
        assert_eq!(
            release_of("6.1", Arch::X86_64, "linux-image-6.1.0-56-cloud-amd64"),
            None
        );
        assert_eq!(
            release_of("6.12", Arch::X86_64, "linux-image-6.12.117+deb12-amd64"),
            Some(117)
        );
        assert_eq!(
            release_of("6.12", Arch::X86_64, "linux-image-6.12.117+deb12-rt-amd64"),
            None
        );
        assert_eq!(
            release_of("6.1", Arch::X86_64, "linux-image-6.12.117+deb12-amd64"),
            None
        );
        assert_eq!(
            release_of("6.12", Arch::Arm64, "linux-image-6.12.117+deb12-arm64"),
            Some(117)
        );
        assert_eq!(
            release_of("6.12", Arch::Arm64, "linux-image-6.12.117+deb12-amd64"),
            None
        );
    }
}
