//! Python frames in memtrace's stacks (issue 63), with no flags: each C
//! call of CPython's eval loop shows as the Python functions it ran, with
//! file and line, for every interpreter of this host from 3.11 to 3.13 (the
//! distribution's, stripped, and pyenv's); a version whose frames are not
//! walked is said.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::nofp::*;
use common::*;

/// Pages the scripts touch from one function.
const PAGES: u64 = 10_000;

/// The interpreters 3.11 to 3.13 on this host, with their minor version.
fn interpreters() -> Vec<(PathBuf, u32)> {
    let mut v = Vec::new();
    if Path::new("/usr/bin/python3.11").exists() {
        v.push((PathBuf::from("/usr/bin/python3.11"), 11));
    }
    for (dir, minor) in [("3.11", 11), ("3.12", 12), ("3.13", 13)] {
        let found = std::fs::read_dir("/root/.pyenv/versions")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{dir}.")))
            });
        if let Some(p) = found.map(|p| p.join("bin/python3")).filter(|p| p.exists()) {
            v.push((p, minor));
        }
    }
    v
}

/// A script in the test's own directory.
fn script(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memtrace-python-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Touches PAGES pages of an anonymous mapping from `touch()` (line 7),
/// called from `outer()` (line 10), on a thread of its own when
/// `threaded`, then as many from a loop over a generator in `gen_touch()`
/// (line 18). It starts once a line comes on its stdin.
const TOUCH: &str = "import mmap, sys, threading
N = 10000
m = mmap.mmap(-1, 2 * N * 4096)

def touch():
    for i in range(0, N * 4096, 4096):
        m[i] = 1

def outer():
    touch()

def pages():
    for i in range(N * 4096, 2 * N * 4096, 4096):
        yield i

def gen_touch():
    for i in pages():
        m[i] = 2

sys.stdin.readline()
if sys.argv[1] == 'threaded':
    t = threading.Thread(target=outer)
    t.start()
    t.join()
else:
    outer()
gen_touch()
";

/// `faults --stacks -p` on a running interpreter: its fault stacks and
/// summary.
fn faults_of(python: &Path, how: &str) -> (Vec<serde_json::Value>, serde_json::Value) {
    let s = script("touch.py", TOUCH);
    let mut p = Command::new(python)
        .arg(&s)
        .arg(how)
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn python");
    let pid = p.id().to_string();
    let t = Tracer::start(&["faults", "--stacks", "--json", "-p", &pid]);
    // memtrace is tracing (its tables built): python goes on.
    let mut stdin = p.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    assert!(wait_child(&mut p, WAIT).success());
    let out = t.wait(Duration::from_secs(30));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let summary = json_of(&out.stdout, "summary").pop().expect("a summary");
    (json_of(&out.stdout, "fault_stack"), summary)
}

/// Faults under stacks with a frame for each of `want` in order, each
/// starting with its first part and holding its second.
fn under(stacks: &[serde_json::Value], want: &[(&str, &str)]) -> u64 {
    stacks
        .iter()
        .filter(|s| {
            let f = user_frames(s);
            let idx: Vec<Option<usize>> = want
                .iter()
                .map(|(start, has)| {
                    f.iter()
                        .position(|x| x.starts_with(start) && x.contains(has))
                })
                .collect();
            idx.iter().all(|i| i.is_some()) && idx.windows(2).all(|w| w[0] < w[1])
        })
        .map(|s| s["count"].as_u64().unwrap())
        .sum()
}

#[test]
fn faults_of_a_running_interpreter_name_the_python_function_and_line() {
    let found = interpreters();
    if found.is_empty() {
        skip(
            "faults_of_a_running_interpreter_name_the_python_function_and_line",
            "no CPython 3.11 to 3.13 on this host",
        );
        return;
    }
    for (python, minor) in found {
        for how in ["main", "threaded"] {
            let (stacks, summary) = faults_of(&python, how);
            let what = format!("{} {how}: {summary}", python.display());
            let mut touch = vec![
                ("touch (", "touch.py:7) [python]"),
                ("outer (", "touch.py:10)"),
            ];
            if how == "threaded" {
                touch.push(("Thread.run (", "threading.py"));
            } else {
                touch.push(("<module> (", "touch.py:26)"));
            }
            // At least 90% of each function's pages, by its Python name.
            let n = under(&stacks, &touch);
            assert!(n * 10 >= PAGES * 9, "touch: {n} of {PAGES}: {what}");
            let g = under(
                &stacks,
                &[
                    ("gen_touch (", "touch.py:18) [python]"),
                    ("<module> (", "touch.py:27)"),
                ],
            );
            assert!(g * 10 >= PAGES * 9, "gen_touch: {g} of {PAGES}: {what}");
            // In place of the eval loop, not beside it.
            let eval = under(&stacks, &[("_PyEval_EvalFrameDefault", "")]);
            assert!(eval * 10 < PAGES, "eval loop frames in {eval}: {what}");
            assert!(summary["python_processes"].as_u64() >= Some(1), "{what}");
            assert!(
                summary["python_stacks_walked"].as_u64() >= Some(2 * PAGES * 9 / 10),
                "{what} (3.{minor})"
            );
        }
    }
}

/// `memleak -c` on a script whose `hoard()` keeps 960 blocks of 64 KiB:
/// the bytes are held under a stack naming it and its line.
#[test]
fn memleak_holds_the_hoarding_python_function() {
    let Some((python, _)) = interpreters().into_iter().next() else {
        skip(
            "memleak_holds_the_hoarding_python_function",
            "no CPython 3.11 to 3.13 on this host",
        );
        return;
    };
    // os._exit: the blocks are still held as the program ends.
    let s = script(
        "hoard.py",
        "import os\nblocks = []\n\ndef hoard():\n    for _ in range(960):\n        blocks.append(bytearray(65536))\n\nhoard()\nos._exit(0)\n",
    );
    let cmd = format!("{} {}", python.display(), s.display());
    let (out, summary) = trace(&["memleak", "--json", "-c", &cmd]);
    let rows = json_of(&out, "memleak");
    let held: u64 = rows
        .iter()
        .filter(|r| {
            let f = user_frames(r);
            at(&f, "hoard (").is_some_and(|i| f[i].contains("hoard.py:6) [python]"))
        })
        .map(|r| r["bytes"].as_u64().unwrap())
        .sum();
    assert!(held >= 960 * 65536, "{held}: {out}");
    assert!(held < 960 * 65536 + (1 << 20), "{held}: {summary}");
}

/// An interpreter before 3.11 is said, once, and its stacks keep the eval
/// loop's native frames.
#[test]
fn an_interpreter_whose_frames_are_not_walked_is_said() {
    let Some(old) = std::fs::read_dir("/root/.pyenv/versions")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("3.10."))
        })
        .map(|p| p.join("bin/python3"))
    else {
        skip(
            "an_interpreter_whose_frames_are_not_walked_is_said",
            "no CPython 3.10 on this host",
        );
        return;
    };
    let (stacks, summary) = {
        let s = script("touch.py", TOUCH);
        let cmd = format!("{} {} main", old.display(), s.display());
        let mut p = Command::new(memtrace_bin())
            .args(["faults", "--stacks", "--json", "-c", &cmd])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        p.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let out = p.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let said: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("python") && l.contains("not walked"))
            .collect();
        assert_eq!(said.len(), 1, "{stderr}");
        assert!(said[0].contains("libpython3.10"), "{stderr}");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let summary = json_of(&stdout, "summary").pop().unwrap();
        (json_of(&stdout, "fault_stack"), summary)
    };
    assert_eq!(summary["python_processes"], 0, "{summary}");
    let eval = under(&stacks, &[("_PyEval_EvalFrameDefault", "")]);
    assert!(eval * 10 >= 2 * PAGES * 9, "{eval}: {summary}");
}

/// `memleak -p` on the distribution's python3.11, a non-PIE executable
/// that takes malloc's and free's addresses (canonical PLT entries): the
/// shim would miss its own calls, so uprobes are used, said, and every
/// block `hoard()` keeps is counted under it. (The shim saw 18 of 980.)
#[test]
fn memleak_p_counts_every_block_of_a_non_pie_python() {
    let py = Path::new("/usr/bin/python3.11");
    if !py.exists() {
        skip(
            "memleak_p_counts_every_block_of_a_non_pie_python",
            "no /usr/bin/python3.11",
        );
        return;
    }
    let s = script(
        "hoardp.py",
        "import sys\nblocks = []\n\ndef hoard():\n    for _ in range(960):\n        blocks.append(bytearray(65536))\n\nsys.stdin.readline()\nhoard()\nprint('held', flush=True)\nsys.stdin.readline()\n",
    );
    let mut p = Command::new(py)
        .arg(&s)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = p.id().to_string();
    let t = Tracer::start(&["memleak", "--json", "-p", &pid]);
    let mut stdin = p.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(p.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "held");
    let out = t.interrupt();
    stdin.write_all(b"done\n").unwrap();
    drop(stdin);
    assert!(wait_child(&mut p, WAIT).success());
    assert_eq!(out.code, 0, "{}", out.stderr);
    // Said (the PLT entry, or a process found busy in its allocator).
    assert!(out.stderr.contains("uprobes instead"), "{}", out.stderr);
    let held: u64 = json_of(&out.stdout, "memleak")
        .iter()
        .filter(|r| {
            let f = user_frames(r);
            at(&f, "hoard (").is_some_and(|i| f[i].contains("hoardp.py:6) [python]"))
        })
        .map(|r| r["bytes"].as_u64().unwrap())
        .sum();
    assert!(held >= 960 * 65536, "{held}: {}", out.stdout);
}
