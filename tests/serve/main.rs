//! `memtrace serve`: /metrics scraped over HTTP during workloads with known
//! counts, the series bound under churn, a port in use, an OOM kill.

mod clients;
#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn scrape(port: u16) -> String {
    let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect to serve");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut s = String::new();
    c.read_to_string(&mut s).unwrap();
    let (head, body) = s.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("openmetrics-text"), "{head}");
    assert!(body.ends_with("# EOF\n"), "not OpenMetrics: {body}");
    body.to_string()
}

/// The value of the series `name` whose labels include every `labels` pair.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn serve(port: u16, extra: &[&str]) -> Tracer {
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec!["serve", "--listen", &listen, "-i", "200ms"];
    args.extend_from_slice(extra);
    Tracer::start(&args)
}

/// Scrapes until `ready` holds (or 15 s pass), then once more after two
/// intervals, so nothing is still on its way.
fn settle(port: u16, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !ready(&scrape(port)) {
        assert!(
            Instant::now() < deadline,
            "metrics never ready: {}",
            scrape(port)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    scrape(port)
}

#[test]
fn counters_match_a_workload_with_known_counts() {
    const PAGES: u64 = 3000;
    const MMAPS: u64 = 40;
    const BRKS: u64 = 25;
    // The same program doing nothing: its own faults after `go` (exit path).
    let mut base = Workload::start(&["counted", "0", "0", "0"]);
    let mut w = Workload::start(&[
        "counted",
        &PAGES.to_string(),
        &MMAPS.to_string(),
        &BRKS.to_string(),
    ]);
    let port = free_port();
    let t = serve(port, &[]);
    base.go();
    w.go();
    let (bp, wp) = (base.pid.to_string(), w.pid.to_string());
    assert!(base.wait().success());
    assert!(w.wait().success());
    let text = settle(port, |m| {
        value(m, "memtrace_mmap_calls_total", &[("pid", &wp)]).is_some_and(|v| v >= MMAPS as f64)
    });
    let get = |name: &str, p: &str, extra: &[(&str, &str)]| -> u64 {
        let mut l: Vec<(&str, &str)> = vec![("pid", p)];
        l.extend_from_slice(extra);
        value(&text, name, &l).unwrap_or(0.0) as u64
    };
    assert_eq!(get("memtrace_mmap_calls_total", &wp, &[]), MMAPS, "{text}");
    assert_eq!(get("memtrace_mmap_bytes_total", &wp, &[]), MMAPS * 8192);
    assert_eq!(get("memtrace_brk_calls_total", &wp, &[]), BRKS);
    assert_eq!(get("memtrace_brk_bytes_total", &wp, &[]), BRKS * 4096);
    let faults = get("memtrace_page_faults_total", &wp, &[("mode", "user")]);
    let base_faults = get("memtrace_page_faults_total", &bp, &[("mode", "user")]);
    assert!(
        faults >= PAGES && faults <= PAGES + base_faults + 2,
        "user faults {faults}, expected {PAGES} + baseline {base_faults}"
    );
    assert_eq!(get("memtrace_mmap_calls_total", &bp, &[]), 0);
    assert_eq!(get("memtrace_brk_calls_total", &bp, &[]), 0);
    // Its cgroup's series holds its counts (and maybe others').
    let cg = text
        .lines()
        .find(|l| l.contains(&format!("pid=\"{wp}\"")))
        .and_then(|l| l.split("cgroup=\"").nth(1)?.split('"').next())
        .expect("cgroup label")
        .to_string();
    let cg_mmaps = value(
        &text,
        "memtrace_cgroup_mmap_calls_total",
        &[("cgroup", &cg)],
    );
    assert!(
        cg_mmaps.unwrap_or(0.0) >= MMAPS as f64,
        "{cg}: {cg_mmaps:?}"
    );
    assert_eq!(
        value(
            &text,
            "memtrace_lost_events_total",
            &[("reason", "map_full")]
        ),
        Some(0.0)
    );
    assert!(
        text.contains("memtrace_probe_attached{probe=\"user page faults\""),
        "{text}"
    );
    let out = t.interrupt();
    assert_eq!(out.code, 0, "{}", out.stderr);
}

#[test]
fn port_in_use_is_one_line_and_exit_2() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let started = Instant::now();
    let out = run(&["serve", "--listen", &format!("127.0.0.1:{port}")]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("address already in use"),
        "{}",
        out.stderr
    );
    // Said before anything is loaded.
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn series_stay_bounded_with_2000_short_lived_processes() {
    const MAX: usize = 20;
    const PROCS: usize = 2000;
    let port = free_port();
    let t = serve(port, &["--max-series", &MAX.to_string()]);
    let mut running = Vec::new();
    for _ in 0..PROCS {
        let c = Command::new(workload_bin())
            .args(["counted", "4", "1", "1"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        running.push(c);
        if running.len() >= 16 {
            for mut c in running.drain(..) {
                wait_child(&mut c, WAIT);
            }
        }
    }
    for mut c in running {
        wait_child(&mut c, WAIT);
    }
    std::thread::sleep(Duration::from_millis(600));
    let text = scrape(port);
    let pids: std::collections::HashSet<&str> = text
        .lines()
        .filter(|l| l.starts_with("memtrace_") && !l.starts_with("memtrace_cgroup"))
        .filter_map(|l| l.split("pid=\"").nth(1)?.split('"').next())
        .collect();
    assert!(pids.len() <= MAX + 1, "{} pids: {pids:?}", pids.len());
    assert!(pids.contains("other"));
    // Nothing is lost to the bound: every workload's mmap call is in a
    // series of its own or in "other" (other processes may add some).
    let mmaps: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("memtrace_mmap_calls_total{")
                && (l.contains("comm=\"memtrace-worklo\"") || l.contains("pid=\"other\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(mmaps >= PROCS as f64, "mmap calls counted: {mmaps}");
    // memtrace's own memory stays small.
    let status = std::fs::read_to_string(format!("/proc/{}/status", t.pid())).unwrap();
    let rss_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    assert!(rss_kb < 256 * 1024, "memtrace RSS {rss_kb} kB");
    let out = t.interrupt();
    assert_eq!(out.code, 0, "{}", out.stderr);
}

#[test]
fn an_oom_kill_in_a_memcg_is_a_labelled_counter() {
    if memcg_root().is_none() {
        skip(
            "an_oom_kill_in_a_memcg_is_a_labelled_counter",
            "no memory cgroup controller",
        );
        return;
    }
    let cg = Memcg::new("serveoom", "64M");
    let port = free_port();
    let t = serve(port, &[]);
    let mut child = cg
        .command(&workload_bin())
        .args(["alloc", "200"])
        .spawn()
        .unwrap();
    let st = wait_child(&mut child, WAIT);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(libc::SIGKILL), "not OOM-killed: {st:?}");
    let path = format!("/{}", cg.name);
    let labels = [("victim", "memtrace-worklo"), ("cgroup", path.as_str())];
    let text = settle(port, |m| {
        value(m, "memtrace_oom_kills_total", &labels).is_some()
    });
    assert_eq!(
        value(&text, "memtrace_oom_kills_total", &labels),
        Some(1.0),
        "{text}"
    );
    // The victim's faults are in its cgroup's series: most of the 16,384
    // pages of the limit (the group's page tables and kernel memory are
    // charged too, so the kill can come a few dozen pages short of it).
    let faults = value(
        &text,
        "memtrace_cgroup_page_faults_total",
        &[("cgroup", &path), ("mode", "user")],
    );
    assert!(faults.unwrap_or(0.0) > 15000.0, "{faults:?}: {text}");
    let out = t.interrupt();
    assert_eq!(out.code, 0, "{}", out.stderr);
}

/// 100 processes that live a few milliseconds each, exec'd by a shell in a
/// memory cgroup of their own: their faults carry the name they exec'd
/// (it said comm="bash" for the program bash exec'd) and their group, taken
/// in the kernel at the fault (45% went to cgroup="unknown": the group was
/// read from /proc after they were gone).
#[test]
fn short_lived_processes_keep_their_exec_name_and_cgroup() {
    const PROCS: usize = 100;
    const PAGES: usize = 200;
    if memcg_root().is_none() {
        skip(
            "short_lived_processes_keep_their_exec_name_and_cgroup",
            "no memory cgroup controller",
        );
        return;
    }
    let cg = Memcg::new("servenames", "1G");
    let port = free_port();
    let t = serve(port, &["--max-series", "10000"]);
    let script = format!("exec {} touch {PAGES}", workload_bin().display());
    for _ in 0..PROCS {
        let mut c = cg
            .command(std::path::Path::new("/bin/sh"))
            .args(["-c", &script])
            .spawn()
            .unwrap();
        assert!(wait_child(&mut c, WAIT).success());
    }
    let path = format!("/{}", cg.name);
    let in_group = |m: &str| {
        value(
            m,
            "memtrace_cgroup_page_faults_total",
            &[("cgroup", &path), ("mode", "user")],
        )
        .unwrap_or(0.0)
    };
    let want = (PROCS * PAGES) as f64;
    let text = settle(port, |m| in_group(m) >= want);
    assert!(in_group(&text) >= want, "{}: {text}", in_group(&text));
    // Per process: the workload's faults are under its exec name, in its
    // group; none of them under the shell's name.
    let series: Vec<(String, f64)> = text
        .lines()
        .filter(|l| l.starts_with("memtrace_page_faults_total{") && l.contains("mode=\"user\""))
        .filter(|l| l.contains(&format!("cgroup=\"{path}\"")))
        .filter_map(|l| Some((l.to_string(), l.rsplit(' ').next()?.parse().ok()?)))
        .collect();
    let named = |comm: &str| -> Vec<f64> {
        series
            .iter()
            .filter(|(l, _)| l.contains(&format!("comm=\"{comm}\"")))
            .map(|(_, v)| *v)
            .collect()
    };
    let workload = named("memtrace-worklo");
    assert_eq!(workload.len(), PROCS, "{text}");
    assert!(workload.iter().all(|v| *v >= PAGES as f64), "{workload:?}");
    assert!(named("sh").iter().all(|v| *v < PAGES as f64), "{text}");
    let out = t.interrupt();
    assert_eq!(out.code, 0, "{}", out.stderr);
}

/// A process in a group named as Docker's systemd driver names a
/// container's: its series carry the container's id (and an empty pod uid),
/// per process and per group, from the path alone.
#[test]
fn a_container_s_group_labels_its_series_with_the_container_id() {
    if memcg_root().is_none() {
        skip(
            "a_container_s_group_labels_its_series_with_the_container_id",
            "no memory cgroup controller",
        );
        return;
    }
    let id = format!("{:064x}", 0xc0ffee_u64 << 32 | std::process::id() as u64);
    let cg = Memcg::named(&format!("docker-{id}.scope"), "1G", false);
    let port = free_port();
    let t = serve(port, &[]);
    let mut c = cg
        .command(&workload_bin())
        .args(["touch", "500"])
        .spawn()
        .unwrap();
    assert!(wait_child(&mut c, WAIT).success());
    let label = format!("container_id=\"{id}\"");
    let line = |m: &str, family: &str| -> Option<String> {
        m.lines()
            .find(|l| l.starts_with(family) && l.contains(&label) && l.contains("mode=\"user\""))
            .map(str::to_string)
    };
    let text = settle(port, |m| {
        line(m, "memtrace_page_faults_total{").is_some()
            && line(m, "memtrace_cgroup_page_faults_total{").is_some()
    });
    let per_proc = line(&text, "memtrace_page_faults_total{").unwrap_or_else(|| panic!("{text}"));
    assert!(per_proc.contains("comm=\"memtrace-worklo\""), "{per_proc}");
    assert!(per_proc.contains("pod_uid=\"\""), "{per_proc}");
    let per_cg = line(&text, "memtrace_cgroup_page_faults_total{").unwrap();
    assert!(
        per_cg.contains(&format!("cgroup=\"/docker-{id}.scope\"")),
        "{per_cg}"
    );
    let out = t.interrupt();
    assert_eq!(out.code, 0, "{}", out.stderr);
}
