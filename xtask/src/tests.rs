//! `cargo xtask test`'s host tests: every test binary built once, then run
//! as root, three at a time. Each binary runs its own tests one at a time
//! (they load eBPF programs and start workloads with known counts), and
//! binaries are independent of each other: their assertions are on their
//! own processes (`-p`, `-c`) and cgroups. Tests that trace the whole host,
//! or count what is loaded on it, run alone after the others.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::{as_root, root, target_dir};

/// Tests that run alone, after the others (the rest of their binary runs
/// with the others), because another binary running beside them changes
/// what they count:
/// - the eBPF programs loaded on the whole host (nothing left attached
///   after an exit): another binary's memtrace would be counted;
/// - the stacks or kills of the whole host, looked for by the workload's
///   functions: other binaries run the same workload functions, and kill
///   in their own groups;
/// - the processes of thousands of children on one row: others' forks in
///   the same minutes wrap pid_max (32,768 here), and a pid reused within
///   the run is one process to memtrace's member sets;
/// - a count map of 128 keys that must never spill: on a loaded CPU more
///   first stacks come before their unwind tables (`tables_pending`) and
///   take keys of their own.
const ALONE: &[(&str, &str)] = &[
    (
        "lifecycle",
        "attach_error_exits_2_naming_missing_kprobes_and_leaves_nothing",
    ),
    ("lifecycle", "bad_input_exits_2_with_one_clear_line"),
    (
        "lifecycle",
        "nothing_stays_loaded_after_duration_sigint_sigterm_sighup",
    ),
    (
        "hardening",
        "a_reader_that_goes_away_ends_memtrace_quietly_and_detached",
    ),
    ("hardening", "missing_capabilities_are_named_and_exit_2"),
    (
        "startup",
        "a_signal_during_set_up_ends_the_run_cleanly_every_time",
    ),
    (
        "top",
        "full_screen_sorts_opens_stacks_and_quits_on_q_detached",
    ),
    (
        "faults",
        "bounds::counts_of_exited_processes_resolve_past_the_bound_and_none_is_lost",
    ),
    (
        "faults",
        "bounds::forked_children_share_their_stacks_keys_in_the_kernel",
    ),
    (
        "brkstack",
        "bounds::stacks_of_exited_processes_resolve_past_the_bound_and_none_is_lost",
    ),
    (
        "brkstack",
        "bounds::every_call_of_thousands_of_children_is_in_every_report",
    ),
    (
        "brkstack",
        "bounds::forked_children_share_their_stacks_keys_in_the_kernel",
    ),
    (
        "stacks",
        "system_wide_by_default_a_process_running_before_attach_unwinds_to_start",
    ),
    (
        "stacks",
        "system_wide_by_default_a_process_started_after_attach_unwinds_to_start",
    ),
    (
        "stacks",
        "system_wide_cpp_fault_stacks_reach_main_by_default",
    ),
    ("stacks", "system_wide_python_stacks_reach_main_by_default"),
    (
        "faults",
        "bounds::stacks_of_processes_gone_before_their_maps_were_read_merge",
    ),
    (
        "heap",
        "oomkill_heap_shows_what_the_victim_held_wherever_the_kill_is",
    ),
    ("memleak", "tables::kernel_mode_sees_what_open_pipes_hold"),
];

/// Binaries whose every test traces the whole host (OOM kills, reclaim,
/// short-lived processes, a busy host, serve's series): they run whole,
/// alone, after the others.
const ALONE_BINARIES: &[&str] = &["busy", "oomkill", "reclaim", "serve", "shortlived"];

/// The slowest binaries, started first so that the pool ends together.
const SLOW_FIRST: &[&str] = &[
    "memleak",
    "faults",
    "stacks",
    "brkstack",
    "allocators",
    "serve",
    "busy",
    "rss",
];

/// Where the tests append the reasons they skipped (`tests/common/host.rs`).
pub fn skip_log() -> PathBuf {
    target_dir().join("test-skips.log")
}

/// One test binary: its name (the file's, without cargo's hash) and path.
#[derive(Clone)]
struct Binary {
    name: String,
    exe: PathBuf,
    /// Its arguments past `--test-threads=1` (filters, skips).
    args: Vec<String>,
    /// Where its output goes (one binary may run twice).
    log: String,
    /// Tests it must run (by exact name): a renamed test that runs alone
    /// must not pass as none.
    expect: Option<u64>,
}

/// The test binaries, built, slowest first.
pub struct Built(Vec<Binary>);

/// Builds memtrace, the workload and the tests, and returns the test
/// binaries, slowest first. One cargo run, not `cargo build` then `cargo
/// test --no-run`: the crate's unit tests (a second compile of all of it)
/// then build beside the crate itself, on the CPU its single-threaded
/// passes leave idle. xtask's own tests build as cargo ran it, unoptimised:
/// its dependencies are built that way already.
pub fn build() -> Result<Built> {
    let mut bins = artifacts(&[
        "build",
        "--release",
        "--lib",
        "--bins",
        "--tests",
        "-p",
        "memtrace",
        "-p",
        "memtrace-common",
        "-p",
        "memtrace-tests",
        "-p",
        "memtrace-workload",
    ])?;
    bins.extend(artifacts(&["test", "--no-run", "-p", "xtask"])?);
    let rank = |b: &Binary| {
        SLOW_FIRST
            .iter()
            .position(|s| *s == b.name)
            .unwrap_or(SLOW_FIRST.len())
    };
    bins.sort_by_key(rank);
    Ok(Built(bins))
}

/// Runs cargo with `args` and returns the test binaries it built.
fn artifacts(args: &[&str]) -> Result<Vec<Binary>> {
    let out = Command::new("cargo")
        .current_dir(root())
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        bail!("building the tests failed");
    }
    let mut bins = Vec::new();
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
        let name = v["target"]["name"].as_str().unwrap_or(exe).to_string();
        // A crate's lib and bin unit tests share its name.
        let log = match v["target"]["kind"][0].as_str() {
            Some("test") | None => name.clone(),
            Some(kind) => format!("{name}-{kind}"),
        };
        bins.push(Binary {
            log,
            expect: None,
            name,
            exe: exe.into(),
            args: Vec::new(),
        });
    }
    Ok(bins)
}

/// A binary running, its output going to a file (printed whole when it
/// ends, so that the binaries' lines do not interleave).
struct Running {
    bin: Binary,
    child: Child,
    log: PathBuf,
    started: Instant,
}

fn start(bin: Binary, env: &[(&str, PathBuf)]) -> Result<Running> {
    let dir = target_dir().join("test-logs");
    std::fs::create_dir_all(&dir)?;
    let log = dir.join(format!("{}.log", bin.log));
    let file = std::fs::File::create(&log)?;
    let mut targs = vec!["--test-threads=1".to_string()];
    targs.extend(bin.args.iter().cloned());
    let child = as_root(&bin.exe, &targs)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(root())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()?;
    Ok(Running {
        bin,
        child,
        log,
        started: Instant::now(),
    })
}

/// The totals of cargo's "test result:" lines.
#[derive(Default)]
pub struct Totals {
    pub passed: u64,
    pub failed: u64,
    /// Binaries that failed or did not end with a result line.
    pub bad: Vec<String>,
}

impl Totals {
    fn add(&mut self, r: &Running, ok: bool) {
        let text = std::fs::read_to_string(&r.log).unwrap_or_default();
        print!("{text}");
        let before = self.passed;
        let mut seen = false;
        for rest in text.lines().filter_map(|l| l.strip_prefix("test result: ")) {
            seen = true;
            let num = |word: &str| -> u64 {
                rest.split([';', '.'])
                    .find_map(|p| p.trim().strip_suffix(word)?.trim().parse().ok())
                    .unwrap_or(0)
            };
            self.passed += num("passed");
            self.failed += num("failed");
        }
        let ran = self.passed - before;
        let short = r.bin.expect.is_some_and(|n| ran < n);
        if short {
            println!(
                "xtask: {} ran {ran} tests, not {:?}",
                r.bin.log, r.bin.expect
            );
        }
        let ok = ok && !short;
        println!(
            "xtask: {} {} in {:.1}s",
            r.bin.log,
            if ok && seen { "passed" } else { "FAILED" },
            r.started.elapsed().as_secs_f64()
        );
        if !ok || !seen {
            self.bad.push(r.bin.log.clone());
        }
    }
}

/// Runs `queue` with at most `jobs` binaries at a time.
fn pool(
    mut queue: VecDeque<Binary>,
    jobs: usize,
    env: &[(&str, PathBuf)],
    totals: &mut Totals,
) -> Result<()> {
    let mut running: Vec<Running> = Vec::new();
    while !queue.is_empty() || !running.is_empty() {
        while running.len() < jobs {
            let Some(b) = queue.pop_front() else { break };
            running.push(start(b, env)?);
        }
        let mut i = 0;
        while i < running.len() {
            if let Some(st) = running[i].child.try_wait()? {
                let r = running.swap_remove(i);
                totals.add(&r, st.success());
            } else {
                i += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// How many binaries run at once: three (CPUs plus one: most tests wait on
/// their workloads), or what `MEMTRACE_TEST_JOBS` says.
fn jobs() -> usize {
    std::env::var("MEMTRACE_TEST_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 1)
        .unwrap_or(3)
}

/// Runs every test binary; `args` go to each (a name filter), and then
/// they run one at a time. `between` runs once the binaries that share the
/// host are done, before those that run alone.
pub fn run(built: Built, args: &[String], between: impl FnOnce()) -> Result<Totals> {
    let env = [
        ("MEMTRACE_SKIP_LOG", skip_log()),
        (
            "MEMTRACE_WORKLOAD",
            target_dir().join("release/memtrace-workload"),
        ),
        ("MEMTRACE_BIN", target_dir().join("release/memtrace")),
    ];
    let bins = built.0;
    let mut totals = Totals::default();
    if !args.is_empty() {
        let bins = bins.into_iter().map(|mut b| {
            b.args = args.to_vec();
            b
        });
        between();
        pool(bins.collect(), 1, &env, &mut totals)?;
        return finish(totals);
    }
    // Every binary with the others, its tests that run alone skipped;
    // those after, one binary at a time, by exact name.
    let mut alone = Vec::new();
    let (whole, bins): (Vec<Binary>, Vec<Binary>) = bins
        .into_iter()
        .partition(|b| ALONE_BINARIES.contains(&b.name.as_str()));
    let shared: VecDeque<Binary> = bins
        .into_iter()
        .map(|mut b| {
            let own: Vec<&str> = ALONE
                .iter()
                .filter(|(bin, _)| *bin == b.name)
                .map(|(_, t)| *t)
                .collect();
            if !own.is_empty() {
                let mut solo = b.clone();
                solo.log = format!("{}-alone", b.name);
                solo.args = own.iter().map(|t| t.to_string()).collect();
                solo.args.push("--exact".into());
                solo.expect = Some(own.len() as u64);
                alone.push(solo);
                for t in own {
                    b.args.extend(["--skip".to_string(), t.to_string()]);
                }
                b.args.push("--exact".into());
            }
            b
        })
        .collect();
    alone.extend(whole);
    let jobs = jobs();
    println!(
        "xtask: {} test binaries, {jobs} at a time; then {} tests and {} binaries alone",
        shared.len(),
        ALONE.len(),
        ALONE_BINARIES.len()
    );
    pool(shared, jobs, &env, &mut totals)?;
    between();
    pool(alone.into(), 1, &env, &mut totals)?;
    finish(totals)
}

fn finish(totals: Totals) -> Result<Totals> {
    if !totals.bad.is_empty() || totals.failed > 0 {
        println!(
            "tests: {} passed, {} failed (in {})",
            totals.passed,
            totals.failed,
            totals.bad.join(", ")
        );
        bail!("{} test binaries failed", totals.bad.len());
    }
    Ok(totals)
}
