//! A Go HTTP server under load (`bench/go-server`, built here with the
//! host's Go), untraced and with `memleak -p` attached: what reading the
//! runtime's heap profile (and turning it on, as its linker left it off)
//! costs the service, in requests a second and p99 latency under `wrk`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::tracer::{have, median, memtrace};
use crate::root;

const URL: &str = "http://127.0.0.1:18080/";
const LOAD: [&str; 5] = ["-t2", "-c50", "-d10s", "--latency", URL];

fn install(pkg: &str, bin: &str) -> Result<()> {
    if !have(bin) {
        eprintln!("bench: installing {pkg} with apt");
        let _ = Command::new("sh")
            .args([
                "-c",
                &format!("DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {pkg}"),
            ])
            .status();
        if !have(bin) {
            bail!("{pkg} could not be installed");
        }
    }
    Ok(())
}

/// The server, built from bench/go-server.
fn build() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join("memtrace-bench-go");
    std::fs::create_dir_all(&dir)?;
    let bin = dir.join("server");
    let st = Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg("main.go")
        .current_dir(root().join("bench/go-server"))
        .env("GO111MODULE", "off")
        .env("GOCACHE", dir.join("cache"))
        .status()
        .context("go build")?;
    if !st.success() {
        bail!("building bench/go-server failed");
    }
    Ok(bin)
}

/// Until the server answers (or 20 s).
fn wait_ready() -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        if std::net::TcpStream::connect("127.0.0.1:18080").is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Requests a second and p99 latency in ms, as wrk reports them.
fn load() -> Option<(f64, f64)> {
    let o = Command::new("wrk").args(LOAD).output().ok()?;
    let text = String::from_utf8_lossy(&o.stdout);
    let rps = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Requests/sec:"))?
        .trim()
        .parse()
        .ok()?;
    let p99 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("99%"))?
        .trim();
    let ms = match p99 {
        v if v.ends_with("ms") => v.trim_end_matches("ms").parse::<f64>().ok()?,
        v if v.ends_with("us") => v.trim_end_matches("us").parse::<f64>().ok()? / 1000.0,
        v if v.ends_with('s') => v.trim_end_matches('s').parse::<f64>().ok()? * 1000.0,
        _ => return None,
    };
    Some((rps, ms))
}

fn end(child: &mut Child, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// One run: the server started, `memleak -p` attached when `traced`.
fn once(server: &PathBuf, traced: bool) -> Option<(f64, f64)> {
    let mut srv = Command::new(server)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut tracer = None;
    let ok = wait_ready() && {
        if traced {
            let mut t = Command::new(memtrace())
                .args(["memleak", "-p", &srv.id().to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .ok()?;
            let ready = super::redis::ready_on_output(&mut t, "Tracing");
            tracer = Some(t);
            ready
        } else {
            true
        }
    };
    let r = ok.then(load).flatten();
    if let Some(t) = tracer.as_mut() {
        end(t, "-INT");
    }
    end(&mut srv, "-TERM");
    r
}

pub(super) fn go_cost(runs: usize, out: &mut String) -> Result<()> {
    install("golang-go", "go")?;
    install("wrk", "wrk")?;
    let server = build()?;
    let configs = [
        ("untraced", false),
        ("memtrace memleak -p (the Go heap profile)", true),
    ];
    let mut got: Vec<Vec<(f64, f64)>> = vec![Vec::new(); configs.len()];
    for _ in 0..runs {
        for (i, (_, traced)) in configs.iter().enumerate() {
            got[i].extend(once(&server, *traced));
        }
    }
    out.push_str(&format!(
        "\n### Go HTTP server (bench/go-server): wrk {}\n\n\
         | tracer | requests/s (median) | of untraced | p99 latency, ms (median) | runs |\n\
         |---|---:|---:|---:|---:|\n",
        LOAD[..4].join(" ")
    ));
    let base = median(got[0].iter().map(|r| r.0).collect());
    for ((name, _), g) in configs.iter().zip(&got) {
        if g.is_empty() {
            out.push_str(&format!("| {name} | failed | | | 0 |\n"));
            continue;
        }
        let rps = median(g.iter().map(|r| r.0).collect());
        let p99 = median(g.iter().map(|r| r.1).collect());
        out.push_str(&format!(
            "| {name} | {rps:.0} | {:.1}% | {p99:.2} | {} |\n",
            100.0 * rps / base,
            g.len()
        ));
    }
    Ok(())
}
