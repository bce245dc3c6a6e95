//! `memtrace memcg` against real memory cgroups: the table's limits, the
//! warning before the OOM kill, `--fail`.

#[path = "../common/mod.rs"]
mod common;
mod prekill;

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::Duration;

use common::*;

/// Skips (printing why) where no memory cgroup can be made.
fn memcg_here(test: &str) -> bool {
    memcg_root().is_some() || {
        skip(test, "no memory cgroup controller (v1 or v2)");
        false
    }
}

/// A child group of `cg` without a limit of its own, removed on drop
/// (before its parent, which `Memcg` removes).
struct Child(std::path::PathBuf);

impl Child {
    fn new(cg: &Memcg, name: impl AsRef<std::path::Path>) -> Child {
        let p = cg.path.join(name);
        std::fs::create_dir_all(&p).expect("create child memcg");
        Child(p)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn sample_of<'a>(rows: &'a [serde_json::Value], cgroup: &str) -> &'a serde_json::Value {
    rows.iter()
        .find(|r| r["cgroup"] == cgroup)
        .unwrap_or_else(|| panic!("no row of {cgroup}: {rows:?}"))
}

#[test]
fn table_row_of_a_limited_group_shows_its_limit() {
    if !memcg_here("table_row_of_a_limited_group_shows_its_limit") {
        return;
    }
    let cg = Memcg::new("table", "96M");
    // No --cgroup: every group with a limit, this one among them.
    let out = run_with(&["memcg", "-d", "1", "--json"], WAIT);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "memcg_sample");
    let r = sample_of(&rows, &format!("/{}", cg.name));
    assert_eq!(r["limit_kb"], 96 * 1024, "{r}");
    assert_eq!(r["limit_at"], format!("/{}", cg.name), "{r}");
    assert_eq!(r["limit_level"], 0, "{r}");
}

#[test]
fn a_limit_set_on_the_parent_is_reported_at_the_parent() {
    if !memcg_here("a_limit_set_on_the_parent_is_reported_at_the_parent") {
        return;
    }
    let cg = Memcg::new("parent", "80M");
    let _kid = Child::new(&cg, "kid");
    let path = format!("/{}/kid", cg.name);
    let out = run_with(&["memcg", "--cgroup", &path, "-d", "1", "--json"], WAIT);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "memcg_sample");
    assert_eq!(rows.len(), 1, "{}", out.stdout);
    let r = sample_of(&rows, &path);
    assert_eq!(r["limit_kb"], 80 * 1024, "{r}");
    assert_eq!(r["limit_at"], format!("/{}", cg.name), "{r}");
    assert_eq!(r["limit_level"], 1, "{r}");
}

#[test]
fn warning_at_75_percent_comes_before_the_oom_kill_and_names_the_grower() {
    if !memcg_here("warning_at_75_percent_comes_before_the_oom_kill_and_names_the_grower") {
        return;
    }
    let cg = Memcg::new("warn", "128M");
    let path = format!("/{}", cg.name);
    let mut tracer = Tracer::start(&["memcg", "--cgroup", &path, "--warn", "75", "--json"]);
    // 10 MiB every 100 ms up to 300 MiB: through 96 MiB, then killed at 128.
    let mut child = cg
        .command(&workload_bin())
        .args(["steps", "10", "30", "100"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let st = wait_child(&mut child, WAIT);
    assert_eq!(st.signal(), Some(libc::SIGKILL), "not OOM-killed: {st:?}");
    tracer.record("memcg_oom", |_| true, WAIT);
    let out = tracer.interrupt();
    assert_eq!(out.code, 0, "{}", out.stderr);
    let types: Vec<String> = out
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| v["type"].as_str().unwrap_or("").to_string())
        .collect();
    let warn_at = types.iter().position(|t| t == "memcg_warn");
    let oom_at = types.iter().position(|t| t == "memcg_oom");
    assert!(
        warn_at.is_some() && oom_at.is_some() && warn_at < oom_at,
        "the warning must come before the kill: {}",
        out.stdout
    );
    let warns = json_of(&out.stdout, "memcg_warn");
    assert_eq!(warns.len(), 1, "one warning per group: {}", out.stdout);
    let w = &warns[0];
    assert_eq!(w["cgroup"], path);
    assert_eq!(w["limit_kb"], 128 * 1024);
    let pct = w["pct"].as_f64().unwrap();
    assert!((75.0..100.0).contains(&pct), "{w}");
    // Growing 100 MiB/s, about a third of a second from its limit.
    let rate = w["grow_kb_s"].as_u64().unwrap_or(0) as f64 / 1024.0;
    assert!((30.0..400.0).contains(&rate), "MiB/s {rate}: {w}");
    let left = w["left_s"].as_f64().unwrap();
    assert!(left > 0.0 && left < 3.0, "{w}");
    assert_eq!(
        w["pids"].as_str().unwrap().split(',').next(),
        Some(pid.to_string().as_str()),
        "{w}"
    );
    // Its latest growth, by the function that allocates.
    let stacks = json_of(&out.stdout, "memcg_warn_stack");
    let s = stacks
        .iter()
        .find(|s| s["pid"] == pid)
        .unwrap_or_else(|| panic!("no stack of {pid}: {}", out.stdout));
    let frames = s["user_stack"].as_array().unwrap();
    assert!(
        frames
            .iter()
            .any(|f| f.as_str().unwrap().contains("allocate_and_touch_mib")),
        "{s}"
    );
    // Whole by default (DWARF in the kernel): through glibc's memset,
    // which has no frame pointer, to _start.
    assert!(
        frames
            .last()
            .and_then(|f| f.as_str())
            .is_some_and(|f| f.starts_with("_start")),
        "{s}"
    );
    // The kill report: the victim and the run-up.
    let kills = json_of(&out.stdout, "memcg_oom");
    assert_eq!(kills.len(), 1, "{}", out.stdout);
    assert_eq!(kills[0]["victim_pid"], pid);
    let timeline = json_of(&out.stdout, "memcg_oom_timeline");
    assert!(
        timeline
            .iter()
            .any(|t| t["usage_kb"].as_u64().unwrap() > 32 * 1024),
        "the timeline shows the growth: {timeline:?}"
    );
    // v1: the climb from the kernel's notifier, a point at each tenth of
    // the limit, though it filled in about 1.3 s (two or three samples).
    if cg.version == CgroupVersion::V1 {
        let steps: std::collections::BTreeSet<&str> = timeline
            .iter()
            .filter_map(|t| t["by"].as_str().filter(|b| b.starts_with("crossed")))
            .collect();
        assert!(steps.len() >= 6, "{steps:?}: {timeline:?}");
    }
    let sample = json_of(&out.stdout, "memcg_sample");
    assert_eq!(sample_of(&sample, &path)["oom_kill"], 1, "{}", out.stdout);
}

#[test]
fn fail_exits_3_after_the_first_warning() {
    if !memcg_here("fail_exits_3_after_the_first_warning") {
        return;
    }
    let cg = Memcg::new("fail", "128M");
    let path = format!("/{}", cg.name);
    let tracer = Tracer::start(&["memcg", "--cgroup", &path, "--warn", "50", "--fail"]);
    // 80 MiB of 128: over the line, under the limit; it stays.
    let mut holder = cg
        .command(&workload_bin())
        .args(["hold", "80"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let out = tracer.wait(Duration::from_secs(30));
    let _ = holder.kill();
    wait_child(&mut holder, WAIT);
    assert_eq!(out.code, 3, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("WARNING"), "{}", out.stdout);
}

#[test]
fn fail_needs_a_warning_to_fail_on() {
    let out = run_with(&["memcg", "--fail", "-d", "1"], WAIT);
    assert_eq!(out.code, 2, "{}", out.stderr);
}

#[test]
fn pressure_warning_on_a_group_without_memory_pressure_says_why() {
    if !memcg_here("pressure_warning_on_a_group_without_memory_pressure_says_why") {
        return;
    }
    let cg = Memcg::new("nopsi", "64M");
    if cg.path.join("memory.pressure").exists() {
        skip(
            "pressure_warning_on_a_group_without_memory_pressure_says_why",
            "this group has memory.pressure (cgroup v2): the kernel matrix tests the trigger",
        );
        return;
    }
    let path = format!("/{}", cg.name);
    let out = run_with(
        &[
            "memcg",
            "--cgroup",
            &path,
            "--warn-pressure",
            "some:10",
            "-d",
            "1",
        ],
        WAIT,
    );
    // Said, and the rest of the run goes on: the table is still printed.
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!("{path}: no PSI trigger")),
        "{}",
        out.stderr
    );
    assert!(out.stdout.contains(&path), "{}", out.stdout);
}

/// Group names are bytes: one that is not UTF-8 is a group like any other,
/// for `--cgroup PID` of a process in it (which failed with "stream did not
/// contain valid UTF-8") and in the table of limited groups (which left it
/// out), shown with `\xNN` for those bytes.
#[test]
fn a_group_named_with_bytes_that_are_not_utf8_is_shown_escaped() {
    use std::os::unix::ffi::OsStrExt;
    if !memcg_here("a_group_named_with_bytes_that_are_not_utf8_is_shown_escaped") {
        return;
    }
    let cg = Memcg::new("bytes", "1G");
    let limit = match cg.version {
        CgroupVersion::V1 => "memory.limit_in_bytes",
        CgroupVersion::V2 => {
            // The child is a memory cgroup of its own only so.
            let _ = std::fs::write(cg.path.join("cgroup.subtree_control"), "+memory");
            "memory.max"
        }
    };
    let kid = Child::new(&cg, std::ffi::OsStr::from_bytes(b"caf\xe9"));
    std::fs::write(kid.0.join(limit), "500M").unwrap();
    let mut p = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    std::fs::write(kid.0.join("cgroup.procs"), p.id().to_string()).unwrap();
    let shown = format!("/{}/caf\\xe9", cg.name);
    let pid = p.id().to_string();
    for args in [&["--cgroup", &pid][..], &[][..]] {
        let mut all = vec!["memcg", "-d", "300ms", "--json"];
        all.extend(args);
        let out = run_with(&all, WAIT);
        assert_eq!(out.code, 0, "{args:?}: {}", out.stderr);
        let rows = json_of(&out.stdout, "memcg_sample");
        let r = sample_of(&rows, &shown);
        assert_eq!(r["limit_kb"], 500 * 1024, "{r}");
    }
    let _ = p.kill();
    let _ = p.wait();
}
