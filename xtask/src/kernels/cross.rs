//! memtrace and memtrace-workload built for the arm64 guest. The pinned
//! nightly builds them (it has rust-src, and rustup here cannot fetch
//! another target's std, so std is built too: `-Z build-std`); Debian's
//! cross gcc links them and compiles the allocator shim. The cross gcc is
//! installed with apt where missing, like the rest of the setup.

use std::process::Command;
use std::time::Instant;

use anyhow::Result;

use super::arch::{cross_dir, ARM64_TARGET};
use crate::{root, setup::pinned_nightly, sh};

/// Debian's packages for the cross gcc and arm64's C library.
const CROSS_PKGS: [&str; 2] = ["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"];

fn have_gcc() -> bool {
    Command::new("aarch64-linux-gnu-gcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Builds the arm64 binaries. `Ok(false)`: no cross gcc and apt could not
/// install it (said; the arm64 guest is skipped). An error: the build
/// itself failed, which fails the matrix.
pub(super) fn build() -> Result<bool> {
    if !have_gcc() {
        eprintln!(
            "xtask: installing {} (apt) for the arm64 guest",
            CROSS_PKGS.join(" ")
        );
        let _ = Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-remove"])
            .args(CROSS_PKGS)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output();
        if !have_gcc() {
            eprintln!(
                "xtask: kernels: arm64 skipped: no aarch64-linux-gnu-gcc and apt could not install it"
            );
            return Ok(false);
        }
    }
    let tc = pinned_nightly()?;
    let t0 = Instant::now();
    eprintln!("xtask: kernels: building memtrace for arm64 ({tc}, -Z build-std)");
    sh(Command::new("rustup")
        .current_dir(root())
        .args(["run", &tc, "cargo", "build", "--release", "-q"])
        .args(["-Z", "build-std=std,panic_abort", "--target", ARM64_TARGET])
        .args(["-p", "memtrace", "-p", "memtrace-workload", "--target-dir"])
        .arg(cross_dir())
        // The outer cargo's compiler is the stable one.
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env("RUSTUP_AUTO_INSTALL", "0")
        .env(
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
            "aarch64-linux-gnu-gcc",
        ))?;
    eprintln!(
        "xtask: kernels: arm64 build took {:.0}s",
        t0.elapsed().as_secs_f64()
    );
    Ok(true)
}
