//! `cargo xtask fuzz [TARGET] [SECONDS]`: the parsers of untrusted input
//! under libFuzzer (cargo-fuzz, installed when missing), each from the seed
//! corpus kept in fuzz/seeds (real files), with AddressSanitizer.

use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{root, sh};

/// The targets, as fuzz/Cargo.toml names them.
pub const TARGETS: [&str; 7] = [
    "tracefs_format",
    "btf",
    "proc_maps",
    "elf",
    "record",
    "ktables_build",
    "gopclntab",
];

pub fn run(only: Option<&str>, seconds: u64) -> Result<()> {
    let targets: Vec<&str> = match only {
        None | Some("all") => TARGETS.to_vec(),
        Some(t) if TARGETS.contains(&t) => vec![t],
        Some(t) => bail!("no fuzz target {t}; there are {}", TARGETS.join(", ")),
    };
    install()?;
    // The nightly the eBPF build pins: sanitizers need a nightly.
    let nightly = crate::setup::pinned_nightly()?;
    let fuzz = root().join("fuzz");
    let mut results = Vec::new();
    for t in targets {
        let corpus = fuzz.join("corpus").join(t);
        std::fs::create_dir_all(&corpus)?;
        println!("xtask: fuzz: {t} for {seconds} s");
        let out = Command::new("cargo")
            .current_dir(&fuzz)
            .args([&format!("+{nightly}"), "fuzz", "run", t])
            .arg(&corpus)
            .arg(fuzz.join("seeds").join(t))
            .args([
                "--",
                &format!("-max_total_time={seconds}"),
                "-print_final_stats=1",
            ])
            // The parsers only: no eBPF object (memtrace/build.rs).
            .env("MEMTRACE_NO_EBPF", "1")
            .output()
            .context("running cargo fuzz")?;
        let err = String::from_utf8_lossy(&out.stderr);
        let runs = err
            .lines()
            .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
            .and_then(|n| n.trim().parse::<u64>().ok());
        if !out.status.success() {
            let tail: Vec<&str> = err.lines().rev().take(40).collect();
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
            bail!("fuzz target {t} failed (the crashing input is under fuzz/artifacts/{t})");
        }
        results.push((t, runs.unwrap_or(0)));
    }
    println!("xtask: fuzz: no crash");
    for (t, n) in results {
        println!("  {t:<16} {n:>12} runs in {seconds} s");
    }
    Ok(())
}

/// cargo-fuzz, when missing.
fn install() -> Result<()> {
    let have = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        println!("xtask: fuzz: installing cargo-fuzz");
        sh(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))?;
    }
    Ok(())
}

/// Every fuzz target compiles (a `cargo check` of the fuzz crate, without
/// the eBPF objects): a move in memtrace that breaks one fails the tests,
/// not the next person who fuzzes.
pub fn check() -> Result<()> {
    let root = crate::root();
    let st = std::process::Command::new("cargo")
        .args(["check", "--quiet", "--bins", "--manifest-path"])
        .arg(root.join("fuzz/Cargo.toml"))
        .arg("--target-dir")
        .arg(crate::target_dir().join("fuzz-check"))
        .env("MEMTRACE_NO_EBPF", "1")
        .status()?;
    if !st.success() {
        bail!("the fuzz targets do not build (fuzz/fuzz_targets)");
    }
    println!("xtask: the {} fuzz targets build", TARGETS.len());
    Ok(())
}

/// The shim's C test under ASan and TSan (memtrace/preload/test/run.sh):
/// batches flushed by threads at exit, the memo's seqlock reader.
pub fn shim_sanitizers() -> Result<()> {
    let script = crate::root().join("memtrace/preload/test/run.sh");
    let out = std::process::Command::new("bash").arg(&script).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    for l in text.lines().filter(|l| !l.ends_with(" failed")) {
        println!("xtask: shim under {l}");
    }
    if !out.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        bail!("the shim's sanitizer test failed");
    }
    Ok(())
}
