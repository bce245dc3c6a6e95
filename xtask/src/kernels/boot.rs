//! Booting one kernel under qemu (TCG) with a hard timeout, keeping what its
//! serial console printed.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::check::{parse, Guest};
use super::{Assets, Boot};

/// A guest that has not powered off by then is killed and fails.
const BOOT_TIMEOUT: Duration = Duration::from_secs(900);

pub(super) fn boot(assets: &Assets, b: &Boot, initrd: &Path) -> Result<Guest> {
    let k = b.k;
    let q = &assets.qemu_root;
    let libdirs = std::env::join_paths([
        q.join("usr/lib/x86_64-linux-gnu"),
        q.join("lib/x86_64-linux-gnu"),
    ])?;
    // At the lowest priority: `cargo xtask test` boots the guests beside
    // the host's tests, which must not wait for the emulator.
    let mut child = Command::new("nice")
        .args(["-n", "19"])
        .arg(q.join(k.arch.qemu()))
        .env("LD_LIBRARY_PATH", &libdirs)
        .arg("-L")
        .arg(q.join("usr/share/qemu"))
        .arg("-L")
        .arg(q.join("usr/share/seabios"))
        // One host thread for both vCPUs: with a thread each (MTTCG), the
        // guest kernel's live code patching (static keys, tracepoints
        // switched on and off) raced and it died with `Oops: int3` in
        // about one run in three on 6.12.
        .args(["-accel", "tcg,thread=single", "-m", "512"])
        .args(k.arch.machine())
        .args(["-smp", "2"])
        .args(["-nographic", "-no-reboot", "-nic", "none"])
        .arg("-kernel")
        .arg(&k.image)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(format!(
            "console={} panic=-1 quiet{}",
            k.arch.console(),
            b.cmdline()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting qemu")?;
    let t0 = Instant::now();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        for l in BufReader::new(stdout).split(b'\n').map_while(|l| l.ok()) {
            s.push_str(&String::from_utf8_lossy(&l));
            s.push('\n');
        }
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut s);
        s
    });
    let mut timed_out = false;
    while child.try_wait()?.is_none() {
        if t0.elapsed() > BOOT_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            timed_out = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let wall = t0.elapsed();
    let mut console = reader.join().unwrap_or_default();
    let qerr = err_reader.join().unwrap_or_default();
    if !qerr.trim().is_empty() {
        console.push_str(&format!("[qemu stderr] {qerr}"));
    }
    if timed_out {
        console.push_str(&format!("[xtask] killed after {BOOT_TIMEOUT:?}\n"));
    }
    let mut g = parse(&console);
    g.wall = wall;
    Ok(g)
}
