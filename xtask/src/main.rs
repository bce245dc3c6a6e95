//! Project tasks: `cargo xtask setup|build|run|test|bench|fuzz|soak`.
//!
//! Set-up (`setup.rs`) is idempotent and says what it installs: the pinned
//! nightly that builds the eBPF programs, its rust-src and bpf-linker.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

mod bench;
mod fuzz;
mod kernels;
mod setup;
mod soak;
mod tests;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what building memtrace needs (the pinned nightly, its rust-src, bpf-linker).
    Setup,
    /// Build memtrace (release) with its eBPF object embedded.
    Build,
    /// Format every Rust file (`cargo fmt` misses the modules a macro declares).
    Fmt,
    /// Build and run memtrace as root: `cargo xtask run -- oomkill`.
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, build, and run every test (unit and integration, as root),
    /// then the kernel matrix when its kernels can be fetched.
    Test {
        /// Only the kernel matrix: memtrace on Debian 6.1 and 6.12 under
        /// qemu, where kprobes and fentry work (fails if it cannot run).
        #[arg(long)]
        kernels: bool,
        /// Extra arguments for the test binaries (e.g. a test name filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Benchmarks against the peer tools; writes bench/RESULTS.md.
    Bench {
        /// Runs per configuration (medians are reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Only this section (`memleak`, `stacks`, `tables`, `startup`, `redis`), replaced in bench/RESULTS.md.
        #[arg(long)]
        only: Option<String>,
        /// Fail when a figure is more than 20% worse than the committed
        /// bench/RESULTS.md (every such figure is said either way).
        #[arg(long)]
        check: bool,
    },
    /// Fuzz the parsers of untrusted input (cargo-fuzz, installed if missing).
    Fuzz {
        /// One target (tracefs_format, btf, proc_maps, elf, record) or `all` (the default).
        target: Option<String>,
        /// Seconds per target.
        #[arg(default_value_t = 60)]
        seconds: u64,
    },
    /// Long-run check: the stateful tools against a churning workload, with
    /// events, losses, RSS and CPU printed every minute.
    Soak {
        #[arg(default_value_t = 30)]
        minutes: u64,
    },
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Cargo's target directory: `CARGO_TARGET_DIR` when set, else `<repo>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => std::path::absolute(&d).unwrap_or_else(|_| d.into()),
        _ => root().join("target"),
    }
}

pub fn sh(cmd: &mut Command) -> Result<()> {
    let st = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !st.success() {
        bail!("{cmd:?} failed with {st}");
    }
    Ok(())
}

pub fn output(cmd: &mut Command) -> Option<String> {
    let o = cmd.output().ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

fn build() -> Result<()> {
    setup::setup()?;
    sh(Command::new("cargo")
        .current_dir(root())
        .args(["build", "--release"]))
}

fn is_root() -> bool {
    output(Command::new("id").arg("-u")).is_some_and(|s| s.trim() == "0")
}

/// Runs `cmd` as root, through `sudo -E` when needed.
fn as_root(program: &Path, args: &[String]) -> Command {
    if is_root() {
        let mut c = Command::new(program);
        c.args(args);
        c
    } else {
        let mut c = Command::new("sudo");
        c.arg("-E").arg(program).args(args);
        c
    }
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Setup => setup::setup(),
        Cmd::Build => build(),
        Cmd::Fmt => {
            if !rustfmt(false)? {
                bail!("rustfmt failed");
            }
            Ok(())
        }
        Cmd::Run { args } => {
            build()?;
            let bin = target_dir().join("release/memtrace");
            let st = as_root(&bin, &args).status()?;
            std::process::exit(st.code().unwrap_or(1));
        }
        Cmd::Test { kernels, args } => {
            if kernels {
                build()?;
                kernels::build_arm64()?;
                return kernels::run(true);
            }
            setup::setup()?;
            fmt_check()?;
            setup::test_readers();
            // After the installs above (apt's locks), beside the build.
            let fetching = kernels::prefetch();
            let skips = tests::skip_log();
            let _ = std::fs::remove_file(&skips);
            let built = tests::build()?;
            fuzz::check()?;
            fuzz::shim_sanitizers()?;
            kernels::build_arm64()?;
            // The guests boot beside the tests that run alone, at the
            // lowest CPU priority (boot.rs): one test at a time mostly
            // waits on its workload, and the emulator takes the CPU it
            // leaves. Beside three binaries at a time, a loaded host
            // showed races in memtrace that tests then caught one run in
            // two (see the README's Tests).
            let mut matrix = None;
            let totals = tests::run(built, &args, || {
                matrix = Some(std::thread::spawn(move || {
                    let _ = fetching.join();
                    kernels::matrix(false)
                }));
            })?;
            let outcome = match matrix {
                Some(m) => m
                    .join()
                    .map_err(|_| anyhow::anyhow!("the kernel matrix's thread panicked"))??,
                None => None,
            };
            kernels::report(outcome)?;
            // One plain closing line with the whole count; skips are
            // counted apart from passes (a skipped test returns early and
            // passes for the harness), each with its reason.
            let skipped = std::fs::read_to_string(&skips).unwrap_or_default();
            for line in skipped.lines() {
                println!("skipped: {line}");
            }
            let n = skipped.lines().count() as u64;
            println!(
                "tests: {} passed, {} failed, {n} skipped",
                totals.passed.saturating_sub(n),
                totals.failed
            );
            Ok(())
        }
        Cmd::Fuzz { target, seconds } => fuzz::run(target.as_deref(), seconds),
        Cmd::Soak { minutes } => {
            build()?;
            soak::run(minutes)
        }
        Cmd::Bench { runs, only, check } => {
            build()?;
            match only.as_deref() {
                Some(section) => bench::run_only(section, runs, check),
                None => bench::run(runs, check),
            }
        }
    }
}

/// Every Rust file of the repository, found by walking it: modules that a
/// macro declares (the tool list, the common crate's module list) are
/// files `cargo fmt` never visits.
fn rust_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with('.') || name == "target" {
                continue;
            }
            if p.is_dir() {
                walk(&p, out);
            } else if name.ends_with(".rs") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root(), &mut out);
    out
}

/// rustfmt over every Rust file (`--check`: only says which differ).
fn rustfmt(check: bool) -> Result<bool> {
    let mut c = Command::new("rustfmt");
    c.current_dir(root()).args(["--edition", "2021"]);
    if check {
        c.arg("--check");
    }
    Ok(c.args(rust_files()).status()?.success())
}

/// Every file of the workspace formatted, those the macros declare included.
fn fmt_check() -> Result<()> {
    if !rustfmt(true)? {
        bail!("files are not formatted (run cargo xtask fmt)");
    }
    Ok(())
}
