//! Helpers shared by the record tests: a scratch directory, memtrace run
//! there, a recorded brkstack run, and finding a stack by its frames.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::*;

/// A fresh directory for one test: records, graphs and the annotation
/// database found in the current directory.
pub fn scratch(name: &str) -> PathBuf {
    scratch_dir("record", name)
}

/// memtrace run in `dir`, without an annotation database from the caller's
/// environment.
pub fn mt(dir: &Path, args: &[&str]) -> Output {
    let out = Command::new(memtrace_bin())
        .args(args)
        .current_dir(dir)
        .env_remove("MEMTRACE_ANNOTATIONS")
        .stdin(Stdio::null())
        .output()
        .expect("run memtrace");
    Output {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        code: out.status.code().unwrap_or(-1),
    }
}

/// brkstack over `script` (one workload command, or several for a shell),
/// recorded to `file`; the live output.
pub fn record(dir: &Path, file: &str, script: &str, extra: &[&str]) -> Output {
    let mut args = vec!["brkstack", "-c", script, "--record", file];
    args.extend_from_slice(extra);
    let out = mt(dir, &args);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(dir.join(file).exists());
    out
}

pub fn w(args: &str) -> String {
    format!("{} {args}", workload_bin().display())
}

/// The stack whose innermost frames are `inner` then `outer`.
pub fn find<'a>(
    stacks: &'a [serde_json::Value],
    inner: &str,
    outer: &str,
) -> &'a serde_json::Value {
    stacks
        .iter()
        .find(|s| {
            let f = user_frames(s);
            f.len() > 1 && f[0].contains(inner) && f[1].contains(outer)
        })
        .unwrap_or_else(|| panic!("no {inner} <- {outer} stack in {stacks:#?}"))
}
