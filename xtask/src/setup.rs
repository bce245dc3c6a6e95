//! `cargo xtask setup`: the pinned nightly that builds the eBPF programs
//! (`memtrace-ebpf/rust-toolchain.toml`), its rust-src (for
//! `-Z build-std=core`) and bpf-linker, built against that nightly's LLVM.
//! Idempotent; says what it installs.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{output, root, sh, target_dir};

/// The bpf-linker the eBPF objects are linked and checked with: its code
/// generation decides how much stack the programs take, which the
/// verifier bounds (a newer release is taken on purpose, not by chance).
const BPF_LINKER: &str = "0.13.0";

/// The `channel` of `memtrace-ebpf/rust-toolchain.toml`, e.g. `nightly-2026-05-20`.
pub fn pinned_nightly() -> Result<String> {
    let file = root().join("memtrace-ebpf/rust-toolchain.toml");
    let text = std::fs::read_to_string(&file).with_context(|| format!("{}", file.display()))?;
    text.lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "channel").then(|| v.trim().trim_matches('"').to_string())
        })
        .with_context(|| format!("no channel in {}", file.display()))
}

fn rustup(args: &[&str]) -> Command {
    let mut c = Command::new("rustup");
    // A missing toolchain is an answer here, never a download.
    c.args(args).env("RUSTUP_AUTO_INSTALL", "0");
    c
}

fn works(c: &mut Command) -> bool {
    c.output().is_ok_and(|o| o.status.success())
}

/// The date of the channel manifest a toolchain was installed from: what
/// rustup calls `nightly-DATE`. rustc's own date is its commit's, a day or
/// so earlier.
fn manifest_date(sysroot: &Path) -> Option<String> {
    let m = std::fs::read_to_string(sysroot.join("lib/rustlib/multirust-channel-manifest.toml"))
        .ok()?;
    m.lines()
        .find_map(|l| l.strip_prefix("date = "))
        .map(|d| d.trim_matches('"').to_string())
}

/// Makes `tc` (`nightly-DATE`) installed: already there; or the installed
/// floating `nightly`, when it came from that very manifest, registered
/// under the pinned name (no download; rustup will not link a custom
/// toolchain under an official name, so it is a symlink in rustup's
/// toolchains directory, which rustup lists and runs as installed); or
/// downloaded by rustup.
fn ensure_toolchain(tc: &str) -> Result<()> {
    if works(&mut rustup(&["run", tc, "rustc", "-V"])) {
        return Ok(());
    }
    let date = tc
        .strip_prefix("nightly-")
        .context("the pin is not nightly-DATE")?;
    let sysroot = output(&mut rustup(&[
        "run", "nightly", "rustc", "--print", "sysroot",
    ]))
    .map(|s| PathBuf::from(s.trim()));
    let have = sysroot.as_deref().and_then(manifest_date);
    if let (Some(sysroot), Some(date_have)) = (&sysroot, &have) {
        if date_have == date {
            return register(tc, sysroot);
        }
    }
    eprintln!("xtask: installing the pinned toolchain {tc} (builds the eBPF programs)");
    let installed = works(&mut rustup(&[
        "toolchain",
        "install",
        tc,
        "--profile",
        "minimal",
        "--component",
        "rust-src",
    ]));
    if !installed {
        bail!(
            "cannot install {tc}, and the installed nightly is from {}: install {tc} \
             (`rustup toolchain install {tc}`) or change memtrace-ebpf/rust-toolchain.toml",
            have.as_deref().unwrap_or("nowhere")
        );
    }
    Ok(())
}

/// Registers the toolchain at `sysroot` as `tc`.
fn register(tc: &str, sysroot: &Path) -> Result<()> {
    let host = output(Command::new("rustc").arg("-vV"))
        .and_then(|v| {
            v.lines()
                .find_map(|l| l.strip_prefix("host: "))
                .map(str::to_string)
        })
        .context("host triple")?;
    let link = sysroot
        .parent()
        .context("toolchains directory")?
        .join(format!("{tc}-{host}"));
    eprintln!(
        "xtask: the installed nightly is {tc}; registering it under that name ({} -> {})",
        link.display(),
        sysroot.display()
    );
    std::os::unix::fs::symlink(sysroot, &link)?;
    if !works(&mut rustup(&["run", tc, "rustc", "-V"])) {
        let _ = std::fs::remove_file(&link);
        bail!("rustup does not run {tc} through {}", link.display());
    }
    Ok(())
}

pub fn setup() -> Result<()> {
    let tc = pinned_nightly()?;
    ensure_toolchain(&tc)?;
    let have_src = output(&mut rustup(&[
        "component",
        "list",
        "--toolchain",
        &tc,
        "--installed",
    ]))
    .is_some_and(|s| s.lines().any(|l| l.starts_with("rust-src")));
    if !have_src {
        eprintln!("xtask: installing rust-src for {tc} (needed by -Z build-std=core)");
        sh(&mut rustup(&[
            "component",
            "add",
            "rust-src",
            "--toolchain",
            &tc,
        ]))?;
    }
    let have = output(&mut rustup(&["run", &tc, "bpf-linker", "--version"]));
    if have.as_deref().is_some_and(|v| v.contains(BPF_LINKER)) {
        return Ok(());
    }
    eprintln!(
        "xtask: installing bpf-linker {BPF_LINKER}, built against {tc}'s LLVM (about a minute)"
    );
    let sysroot = output(&mut rustup(&["run", &tc, "rustc", "--print", "sysroot"]))
        .context("the pinned nightly's sysroot")?;
    let lib = Path::new(sysroot.trim()).join("lib");
    let llvm = std::fs::read_dir(&lib)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so") || n.starts_with("libLLVM-"))
        })
        .with_context(|| format!("no libLLVM in {}", lib.display()))?;
    let major = output(&mut rustup(&["run", &tc, "rustc", "-vV"]))
        .and_then(|v| {
            v.lines()
                .find_map(|l| l.strip_prefix("LLVM version: "))
                .and_then(|s| s.split('.').next().map(str::to_string))
        })
        .context("the pinned nightly's LLVM version")?;
    let prefix = target_dir().join("xtask-llvm");
    std::fs::create_dir_all(prefix.join("lib"))?;
    let link = prefix.join("lib/libLLVM.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&llvm, &link)?;
    sh(Command::new("cargo")
        .args([
            "install",
            "bpf-linker",
            "--version",
            &format!("={BPF_LINKER}"),
            "--force",
            "--locked",
            "--no-default-features",
            "--features",
            &format!("llvm-{major}"),
        ])
        .env("LLVM_PREFIX", &prefix))
}

/// Programs the tests read memtrace's output with, independently of it,
/// and libraries their workloads run on: installed with apt where missing (tests that need one skip, with the
/// reason, where it cannot be had).
pub fn test_readers() {
    // protoc decodes --pprof output against the published schema; go
    // builds the Go programs the runtime tests trace.
    const READERS: [(&str, &str, &str); 2] = [
        ("protoc", "--version", "protobuf-compiler"),
        ("go", "version", "golang-go"),
    ];
    // jemalloc: the allocator tests' programs run on it too.
    const LIBS: [(&str, &str); 1] =
        [("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "libjemalloc2")];
    let missing = READERS
        .into_iter()
        .filter(|(bin, arg, _)| {
            !Command::new(bin)
                .arg(arg)
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(|(bin, _, pkg)| (bin, pkg))
        .chain(
            LIBS.into_iter()
                .filter(|(path, _)| cfg!(target_arch = "x86_64") && !Path::new(path).exists()),
        );
    for (bin, pkg) in missing {
        eprintln!("xtask: installing {pkg} (apt) for the tests' {bin}");
        let ok = works(
            Command::new("apt-get")
                .args(["install", "-y", "-qq", "--no-remove", pkg])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        );
        if !ok {
            eprintln!("xtask: could not install {pkg}: the tests that need {bin} will skip");
        }
    }
}
