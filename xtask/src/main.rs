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
        /// Only this section (`memleak`, `stacks`, `tables`), replaced in bench/RESULTS.md.
        #[arg(long)]
        only: Option<String>,
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
        Cmd::Run { args } => {
            build()?;
            let bin = target_dir().join("release/memtrace");
            let st = as_root(&bin, &args).status()?;
            std::process::exit(st.code().unwrap_or(1));
        }
        Cmd::Test { kernels, args } => {
            build()?;
            if kernels {
                return kernels::run(true);
            }
            fmt_check()?;
            setup::test_readers();
            let skips = skip_log();
            let _ = std::fs::remove_file(&skips);
            let (passed, failed) = test(&args)?;
            kernels::run(false)?;
            // One plain closing line with the whole count; skips are
            // counted apart from passes (a skipped test returns early and
            // passes for the harness), each with its reason.
            let skipped = std::fs::read_to_string(&skips).unwrap_or_default();
            for line in skipped.lines() {
                println!("skipped: {line}");
            }
            let n = skipped.lines().count() as u64;
            println!(
                "tests: {} passed, {failed} failed, {n} skipped",
                passed.saturating_sub(n)
            );
            Ok(())
        }
        Cmd::Fuzz { target, seconds } => fuzz::run(target.as_deref(), seconds),
        Cmd::Soak { minutes } => {
            build()?;
            soak::run(minutes)
        }
        Cmd::Bench { runs, only } => {
            build()?;
            match only.as_deref() {
                Some(section) => bench::run_only(section, runs),
                None => bench::run(runs),
            }
        }
    }
}

/// Runs every test with the paths of the built binaries in the environment.
/// Integration tests load eBPF programs and create cgroups, so they run as
/// root and one at a time.
/// Runs `cmd`, echoing its stdout, and adds up cargo's "test result" lines.
fn run_counting(cmd: &mut Command) -> Result<(u64, u64, bool)> {
    use std::io::BufRead;
    let mut child = cmd.stdout(std::process::Stdio::piped()).spawn()?;
    let (mut passed, mut failed) = (0, 0);
    let out = child.stdout.take().unwrap();
    for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            let num = |word: &str| -> u64 {
                rest.split([';', '.'])
                    .find_map(|p| p.trim().strip_suffix(word)?.trim().parse().ok())
                    .unwrap_or(0)
            };
            passed += num("passed");
            failed += num("failed");
        }
    }
    Ok((passed, failed, child.wait()?.success()))
}

/// Where the tests append the reasons they skipped (`tests/common/host.rs`).
fn skip_log() -> PathBuf {
    target_dir().join("test-skips.log")
}

/// Every file of the workspace formatted, the tools' included.
fn fmt_check() -> Result<()> {
    let st = Command::new("cargo")
        .current_dir(root())
        .args(["fmt", "--all", "--check"])
        .status()?;
    if !st.success() {
        bail!("cargo fmt --all --check: files are not formatted (run cargo fmt --all)");
    }
    Ok(())
}

fn test(args: &[String]) -> Result<(u64, u64)> {
    let env = [
        ("MEMTRACE_SKIP_LOG", skip_log()),
        (
            "MEMTRACE_WORKLOAD",
            target_dir().join("release/memtrace-workload"),
        ),
        ("MEMTRACE_BIN", target_dir().join("release/memtrace")),
    ];
    let mut targs = vec!["--test-threads=1".to_string()];
    targs.extend(args.iter().cloned());
    if is_root() {
        let mut c = Command::new("cargo");
        c.current_dir(root())
            .args(["test", "--release", "--"])
            .args(&targs)
            .envs(env.clone());
        let (passed, failed, ok) = run_counting(&mut c)?;
        if !ok || failed > 0 {
            println!("tests: {passed} passed, {failed} failed");
            bail!("tests failed");
        }
        return Ok((passed, failed));
    }
    // Not root: build as the user, run each test binary through sudo.
    let out = Command::new("cargo")
        .current_dir(root())
        .args(["test", "--release", "--no-run", "--message-format=json"])
        .output()?;
    if !out.status.success() {
        bail!(
            "building the tests failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (mut passed, mut failed, mut bad) = (0, 0, 0);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
            continue;
        }
        let Some(exe) = v["executable"].as_str() else {
            continue;
        };
        let (p, f, ok) = run_counting(
            as_root(Path::new(exe), &targs)
                .envs(env.clone())
                .current_dir(root()),
        )?;
        passed += p;
        failed += f;
        bad += (!ok) as usize;
    }
    if bad > 0 || failed > 0 {
        println!("tests: {passed} passed, {failed} failed");
        bail!("{bad} test binaries failed");
    }
    Ok((passed, failed))
}
