//! The architectures the matrix boots: x86-64, the host's, and arm64 under
//! full emulation with memtrace cross-built for it (`cross.rs`). What
//! differs between their guests: packages, qemu's machine, the console,
//! where the binaries and their shared libraries come from.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::target_dir;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Arch {
    X86_64,
    Arm64,
}

/// Where the arm64 binaries are built (a target directory of their own:
/// another toolchain builds them, with its own std).
pub(super) const ARM64_TARGET: &str = "aarch64-unknown-linux-gnu";
/// Debian's cross toolchain's prefix, and where its target libraries are.
const ARM64_GNU: &str = "aarch64-linux-gnu";

impl Arch {
    /// Debian's name, the suffix of its kernel packages.
    pub fn deb(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    pub fn qemu(self) -> &'static str {
        match self {
            Arch::X86_64 => "usr/bin/qemu-system-x86_64",
            Arch::Arm64 => "usr/bin/qemu-system-aarch64",
        }
    }

    /// The machine qemu emulates. arm64: the generic `virt` board; `max`
    /// with the implementation-defined pointer authentication, which
    /// emulates several times faster than the architected one.
    pub fn machine(self) -> &'static [&'static str] {
        match self {
            Arch::X86_64 => &["-cpu", "max"],
            Arch::Arm64 => &["-M", "virt", "-cpu", "max,pauth-impdef=on"],
        }
    }

    /// The serial console's device in the guest.
    pub fn console(self) -> &'static str {
        match self {
            Arch::X86_64 => "ttyS0",
            Arch::Arm64 => "ttyAMA0",
        }
    }

    /// Where memtrace and memtrace-workload for this architecture are.
    pub fn release_dir(self) -> PathBuf {
        match self {
            Arch::X86_64 => target_dir().join("release"),
            Arch::Arm64 => cross_dir().join(ARM64_TARGET).join("release"),
        }
    }

    /// The shared libraries `bin` loads, each as (its path in the guest,
    /// the file here): ldd for the host's own; arm64's from the cross
    /// toolchain's libraries, by their `NEEDED` entries (ldd cannot run
    /// them).
    pub fn libs(self, bin: &Path) -> Result<Vec<(PathBuf, PathBuf)>> {
        match self {
            Arch::X86_64 => Ok(ldd(bin)?.into_iter().map(|p| (p.clone(), p)).collect()),
            Arch::Arm64 => arm64_libs(bin),
        }
    }
}

/// The cross build's target directory.
pub(super) fn cross_dir() -> PathBuf {
    target_dir().join("cross")
}

/// Shared libraries `ldd` lists for `bin` (the dynamic loader included).
fn ldd(bin: &Path) -> Result<Vec<PathBuf>> {
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

/// `NEEDED` entries of an ELF file, by the cross binutils' readelf.
fn needed(file: &Path) -> Result<Vec<String>> {
    let out = Command::new(format!("{ARM64_GNU}-readelf"))
        .arg("-d")
        .arg(file)
        .output()
        .with_context(|| format!("running {ARM64_GNU}-readelf"))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split_once('[')?.1.split_once(']')?.0.to_string()))
        .collect())
}

/// `bin`'s libraries, transitively, where Debian's arm64 system has them
/// (`/lib/aarch64-linux-gnu`), and its dynamic loader.
fn arm64_libs(bin: &Path) -> Result<Vec<(PathBuf, PathBuf)>> {
    let from = PathBuf::from(format!("/usr/{ARM64_GNU}/lib"));
    let loader = "ld-linux-aarch64.so.1";
    let mut seen = BTreeSet::new();
    let mut todo = needed(bin)?;
    while let Some(name) = todo.pop() {
        if name == loader || !seen.insert(name.clone()) {
            continue;
        }
        let src = from.join(&name);
        anyhow::ensure!(
            src.exists(),
            "{}: not there (libc6-dev-arm64-cross)",
            src.display()
        );
        todo.extend(needed(&src)?);
    }
    let mut v: Vec<_> = seen
        .into_iter()
        .map(|n| (Path::new("/lib").join(ARM64_GNU).join(&n), from.join(n)))
        .collect();
    v.push((Path::new("/lib").join(loader), from.join(loader)));
    Ok(v)
}
