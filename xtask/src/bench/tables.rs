//! Start-up with in-kernel unwind tables: memtrace attached to a running
//! process that maps libc, ld.so and a large library (the nightly
//! toolchain's libLLVM, 200 MB, 7.7 MB of .eh_frame), until it says
//! "Tracing" (every table built by then), against frame pointers for the
//! same process: the difference is the unwinder's verification and the
//! tables.

use anyhow::{Context, Result};
use std::process::{Command, Stdio};

use super::tracer::{median, s};

/// The large library: the nightly toolchain's LLVM.
fn big_library() -> Option<std::path::PathBuf> {
    let o = Command::new("rustc")
        .args(["+nightly", "--print", "sysroot"])
        .output()
        .ok()?;
    let lib = std::path::Path::new(String::from_utf8_lossy(&o.stdout).trim()).join("lib");
    std::fs::read_dir(lib)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libLLVM.so."))
        })
}

/// One run of `argv` for 0.2 s with MEMTRACE_TIMING: (ms to attached, ms
/// to the target's maps read and tables built, ms building tables).
fn timed(argv: &[String]) -> Result<(f64, f64, f64)> {
    let o = Command::new(&argv[0])
        .args(&argv[1..])
        .args(["-d", "0.2"])
        .env("MEMTRACE_TIMING", "1")
        .output()?;
    let err = String::from_utf8_lossy(&o.stderr);
    let phase = |what: &str| -> Option<f64> {
        let l = err.lines().find(|l| l.contains(what))?;
        l.rsplit(": ").next()?.trim_end_matches(" ms").parse().ok()
    };
    let attached = phase("timing: attached").context(err.to_string())?;
    let read = phase("timing: target's maps read").unwrap_or(attached);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let built = stdout
        .lines()
        .find(|l| l.contains("\"type\":\"summary\""))
        .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .and_then(|v| v["unwind_table_build_ms"].as_f64())
        .unwrap_or(0.0);
    Ok((attached, read, built))
}

pub(super) fn startup_tables(m: &str, runs: usize, out: &mut String) -> Result<()> {
    let Some(lib) = big_library() else {
        out.push_str("\n### Start-up with unwind tables\n\nno nightly libLLVM to map\n");
        return Ok(());
    };
    let size = std::fs::metadata(&lib)?.len() >> 20;
    // python3 maps libc and ld.so; ctypes maps the library. It waits.
    let mut target = Command::new("python3")
        .args([
            "-c",
            "import ctypes,sys,time; ctypes.CDLL(sys.argv[1]); print('ready', flush=True); time.sleep(600)",
        ])
        .arg(&lib)
        .stdout(Stdio::piped())
        .spawn()
        .context("python3")?;
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(target.stdout.take().unwrap()),
        &mut line,
    )?;
    let pid = target.id().to_string();
    out.push_str(&format!(
        "\n### Start-up with unwind tables (-p of a process mapping libc, ld.so and libLLVM, {size} MiB)\n\n\
         | memtrace faults --stacks -p PID | programs loaded and attached, ms | then maps read and tables built (total), ms | of which building tables, ms |\n|---|---:|---:|---:|\n"
    ));
    for (name, extra) in [
        ("--stack-mode fp", vec!["--stack-mode", "fp"]),
        ("default (dwarf in the kernel)", vec![]),
    ] {
        let mut argv = s(&[m, "faults", "--stacks", "-p", &pid, "--json"]);
        argv.extend(s(&extra));
        let (mut att, mut read, mut built) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            let (a, r, b) = timed(&argv)?;
            att.push(a);
            read.push(r);
            built.push(b);
        }
        out.push_str(&format!(
            "| {name} | {:.0} | {:.0} | {:.1} |\n",
            median(att),
            median(read),
            median(built)
        ));
    }
    system_wide(m, runs, out)?;
    let _ = target.kill();
    let _ = target.wait();
    Ok(())
}

/// System-wide, as a user runs it (the libLLVM process above still
/// running): attached, then every running process's tables built in the
/// background, and the table memory that took.
fn system_wide(m: &str, runs: usize, out: &mut String) -> Result<()> {
    out.push_str(
        "\n### System-wide start-up (memtrace faults --stacks, the default: dwarf in the kernel)\n\n\
         | processes running | of them with maps (not kernel threads) | programs loaded and attached, ms | every running process's tables built, ms | table memory used, MiB |\n|---:|---:|---:|---:|---:|\n",
    );
    let (mut n, mut read, mut att, mut seeded, mut used) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let o = Command::new(m)
            .args(["faults", "--stacks", "--json", "-d", "4"])
            .env("MEMTRACE_TIMING", "1")
            .output()?;
        let err = String::from_utf8_lossy(&o.stderr);
        let a: f64 = err
            .lines()
            .find(|l| l.contains("timing: attached"))
            .and_then(|l| l.rsplit(": ").next()?.trim_end_matches(" ms").parse().ok())
            .context(err.to_string())?;
        let stdout = String::from_utf8_lossy(&o.stdout);
        let v: serde_json::Value = stdout
            .lines()
            .find(|l| l.contains("\"type\":\"summary\""))
            .and_then(|l| serde_json::from_str(l).ok())
            .context("no summary")?;
        let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        att.push(a);
        n.push(f("unwind_running_processes"));
        read.push(f("unwind_running_read"));
        seeded.push(f("unwind_running_read_ms"));
        used.push(f("unwind_table_used_bytes") / 1048576.0);
    }
    out.push_str(&format!(
        "| {:.0} | {:.0} | {:.0} | {:.0} | {:.1} |\n",
        median(n),
        median(read),
        median(att),
        median(seeded),
        median(used)
    ));
    Ok(())
}
