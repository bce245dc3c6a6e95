//! Redis under memleak beside heaptrack: `redis-benchmark -t set -d 1000`
//! against a server untraced, attached to with `-p` (memtrace's injected
//! shim, heaptrack's gdb injection) and started under each (`-c`, and
//! heaptrack running it). The README's Redis figures come from here.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::tracer::{have, median, memtrace, s};

const PORT: &str = "16379";
const REQUESTS: &str = "200000";
const CLIENTS: &str = "50";
const HEAPTRACK_OUT: &str = "/tmp/memtrace-bench-redis-heaptrack";

fn server_args() -> Vec<String> {
    s(&[
        "--port",
        PORT,
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
    ])
}

/// Until the server answers PING (or 20 s).
fn wait_ready() -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        let ok = Command::new("redis-cli")
            .args(["-p", PORT, "ping"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("PONG"));
        if ok {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// SET requests a second, as redis-benchmark reports them.
fn throughput() -> Option<f64> {
    let o = Command::new("redis-benchmark")
        .args([
            "-p", PORT, "-t", "set", "-d", "1000", "-n", REQUESTS, "-c", CLIENTS, "-q",
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&o.stdout);
    // "SET: 49504.95 requests per second, p50=..." (after \r progress lines).
    text.split(['\r', '\n'])
        .filter_map(|l| l.trim().strip_prefix("SET: "))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .next_back()
}

/// Reads `child`'s output (heaptrack says it on stdout, memtrace on
/// stderr) until a line containing `ready`; false at its end or after a
/// minute.
pub(super) fn ready_on_output(child: &mut Child, ready: &str) -> bool {
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let out = child
        .stdout
        .take()
        .map(|o| Box::new(o) as Box<dyn std::io::Read + Send>);
    let err = child
        .stderr
        .take()
        .map(|e| Box::new(e) as Box<dyn std::io::Read + Send>);
    for pipe in [out, err].into_iter().flatten() {
        let tx = tx.clone();
        // Drained to the end, or the tracer blocks on a full pipe.
        std::thread::spawn(move || {
            for l in BufReader::new(pipe).lines().map_while(|l| l.ok()) {
                let _ = tx.send(l);
            }
        });
    }
    drop(tx);
    let until = Instant::now() + Duration::from_secs(60);
    while let Ok(l) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
        if l.contains(ready) {
            return true;
        }
    }
    false
}

/// Throws `child`'s output away as it comes (a full pipe would stall it).
fn drain(child: &mut Child) {
    let out = child
        .stdout
        .take()
        .map(|o| Box::new(o) as Box<dyn std::io::Read + Send>);
    let err = child
        .stderr
        .take()
        .map(|e| Box::new(e) as Box<dyn std::io::Read + Send>);
    for mut pipe in [out, err].into_iter().flatten() {
        std::thread::spawn(move || std::io::copy(&mut pipe, &mut std::io::sink()));
    }
}

fn stop(child: &mut Child, sig: &str) {
    // The tracer's whole group (its pid is the group's id).
    let _ = Command::new("kill")
        .args([sig, "--", &format!("-{}", child.id())])
        .status();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(30) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status();
    let _ = child.wait();
}

fn shutdown() {
    let _ = Command::new("redis-cli")
        .args(["-p", PORT, "shutdown", "nosave"])
        .output();
}

/// One measurement under `how`: "untraced", "-p" with `tracer`, or "-c".
fn once(how: &str, tracer: &[String], ready: &str) -> Option<f64> {
    // Each in a process group of its own, ended whole: heaptrack's script
    // leaves subshells behind when only it is signalled.
    let spawn = |argv: Vec<String>| {
        use std::os::unix::process::CommandExt;
        Command::new(&argv[0])
            .args(&argv[1..])
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .ok()
    };
    let mut server_cmd = vec!["redis-server".to_string()];
    server_cmd.extend(server_args());
    let r = match how {
        "-p" => {
            let mut server = spawn(server_cmd)?;
            drain(&mut server);
            wait_ready().then_some(())?;
            let mut t = tracer.to_vec();
            t.extend(["-p".to_string(), server.id().to_string()]);
            let mut tr = spawn(t)?;
            let attached = ready_on_output(&mut tr, ready);
            let r = attached.then(throughput).flatten();
            // The tracer lets go first (memtrace puts the calls back).
            stop(&mut tr, "-INT");
            shutdown();
            let _ = server.wait();
            r
        }
        "-c" => {
            let mut t = tracer.to_vec();
            if t[0].ends_with("memtrace") {
                // A shell command: the empty argument quoted.
                let sh =
                    format!("redis-server --port {PORT} --save '' --appendonly no --daemonize no");
                t.extend(["-c".to_string(), sh]);
            } else {
                t.extend(server_cmd);
            }
            let mut tr = spawn(t)?;
            drain(&mut tr);
            let r = wait_ready().then(throughput).flatten();
            shutdown();
            stop(&mut tr, "-INT");
            r
        }
        _ => {
            let mut server = spawn(server_cmd)?;
            drain(&mut server);
            let r = wait_ready().then(throughput).flatten();
            shutdown();
            let _ = server.wait();
            r
        }
    };
    // heaptrack -p's script leaves a subshell behind, outside its group.
    let _ = Command::new("pkill")
        .args(["-KILL", "-f", &format!("heaptrack -o {HEAPTRACK_OUT}")])
        .status();
    for ext in ["zst", "gz"] {
        let _ = std::fs::remove_file(format!("{HEAPTRACK_OUT}.{ext}"));
    }
    r
}

pub(super) fn redis_cost(runs: usize, out: &mut String) -> Result<()> {
    if !have("redis-server") || !have("redis-benchmark") {
        eprintln!("bench: installing redis-server and redis-tools with apt");
        let _ = Command::new("sh")
            .args([
                "-c",
                "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools",
            ])
            .status();
        if !have("redis-server") {
            bail!("redis-server could not be installed");
        }
    }
    // The packaged service would hold the default port and a CPU.
    let _ = Command::new("systemctl")
        .args(["stop", "redis-server"])
        .output();
    let m = memtrace();
    let ht = have("heaptrack");
    let configs: Vec<(&str, &str, Option<Vec<String>>, &str)> = vec![
        ("untraced", "", Some(Vec::new()), ""),
        (
            "memtrace memleak -p (injected shim, exact)",
            "-p",
            Some(s(&[&m, "memleak"])),
            "Tracing",
        ),
        (
            "heaptrack -p",
            "-p",
            ht.then(|| s(&["heaptrack", "-o", HEAPTRACK_OUT])),
            "injection finished",
        ),
        (
            "memtrace memleak -c (preloaded shim, exact)",
            "-c",
            Some(s(&[&m, "memleak"])),
            "",
        ),
        (
            "heaptrack redis-server",
            "-c",
            ht.then(|| s(&["heaptrack", "-o", HEAPTRACK_OUT])),
            "",
        ),
    ];
    out.push_str(&format!(
        "\n### Redis: redis-benchmark -t set -d 1000 ({REQUESTS} requests, {CLIENTS} clients)\n\n\
         | tracer | SET requests/s (median) | of untraced | runs |\n|---|---:|---:|---:|\n"
    ));
    // Alternating, a run of each configuration in turn.
    let mut got: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for _ in 0..runs {
        for (i, (_, how, argv, ready)) in configs.iter().enumerate() {
            if let Some(argv) = argv {
                if let Some(r) = once(how, argv, ready) {
                    got[i].push(r);
                }
            }
        }
    }
    let base = median(got[0].clone());
    for (i, (name, _, argv, _)) in configs.iter().enumerate() {
        if argv.is_none() {
            out.push_str(&format!("| {name} | not installed | | |\n"));
        } else if got[i].is_empty() {
            out.push_str(&format!("| {name} | failed to run | | |\n"));
        } else {
            let n = got[i].len();
            let r = median(got[i].clone());
            out.push_str(&format!("| {name} | {r:.0} | {:.2} | {n} |\n", r / base));
        }
    }
    Ok(())
}
