//! memtrace runs as root and puts code into other processes: nothing it
//! writes, maps into them or hands them may be reachable by another user
//! or lead root's writes out of a container. Each test plays the attacker.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// A library whose constructor leaves `marker` behind: planted where an
/// attacker would, it must never run.
fn planted_library(marker: &Path) -> PathBuf {
    let dir = scratch_dir("rootsafe", "planted");
    let src = dir.join("planted.c");
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\n__attribute__((constructor)) static void own(void) {{\n\
             FILE *f = fopen(\"{}\", \"w\"); if (f) fclose(f); }}\n",
            marker.display()
        ),
    )
    .unwrap();
    let so = dir.join("planted.so");
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success());
    so
}

/// A directory as an unprivileged user (nobody) would make it first:
/// theirs, writable by all, with `lib` planted under every name memtrace
/// ever gave its shim.
fn attacker_dir(dir: &Path, lib: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    for name in ["memtrace-preload.so", "memtrace-preload-0.so"] {
        std::fs::copy(lib, dir.join(name)).unwrap();
    }
    for e in std::fs::read_dir(dir).unwrap() {
        std::os::unix::fs::chown(e.unwrap().path(), Some(65534), Some(65534)).unwrap();
    }
    std::os::unix::fs::chown(dir, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
}

/// Where /run is mounted noexec (Ubuntu's), the shim goes to a directory
/// memtrace makes for the run, never into one another user made first
/// (`/var/tmp/memtrace`, `/tmp/memtrace`, theirs): a library swapped in
/// there would run as root in the command.
#[test]
fn a_directory_another_user_made_first_is_never_used_for_the_shim() {
    if !installed("unshare", "--help") {
        return skip("rootsafe", "no unshare");
    }
    let marker = std::env::temp_dir().join(format!("rootsafe-owned-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let lib = planted_library(&marker);
    for d in ["/var/tmp/memtrace", "/tmp/memtrace"] {
        attacker_dir(Path::new(d), &lib);
    }
    // As nobody, the planted library swapped in again and again, under
    // every name found there, for as long as memtrace runs.
    let swap = format!(
        "while :; do for d in /var/tmp/memtrace /tmp/memtrace; do for f in $d/*; do \
         cp {lib} $d/.x && mv -f $d/.x \"$f\"; done; cp {lib} $d/memtrace-preload-$$.so; done; done",
        lib = lib.display()
    );
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        lib.parent().unwrap(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let mut swapper = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
            &swap,
        ])
        .spawn()
        .unwrap();
    // A private mount namespace with a noexec tmpfs on /run.
    let script = format!(
        "mount -t tmpfs -o noexec,mode=755 tmpfs /run && exec {} memleak -v --json -c '{} leak 9 3000 0 0 100'",
        memtrace_bin().display(),
        workload_bin().display()
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    let _ = swapper.kill();
    let _ = swapper.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stderr}");
    let shim = stderr
        .lines()
        .find_map(|l| l.strip_prefix("memtrace: memleak: allocator shim: "))
        .and_then(|l| l.split(" (").next())
        .unwrap_or_else(|| panic!("where the shim went is said with -v: {stderr}"));
    let dir = Path::new(shim).parent().unwrap();
    for d in ["/var/tmp/memtrace", "/tmp/memtrace", "/run"] {
        assert_ne!(dir, Path::new(d), "{stderr}");
    }
    assert!(
        dir.starts_with("/var/tmp") || dir.starts_with("/tmp") || dir.starts_with("/dev/shm"),
        "{stderr}"
    );
    // The run's own directory is gone with the run.
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert!(!marker.exists(), "the planted library ran as root");
    // And the answer is the workload's.
    let rows = json_of(&stdout, "memleak");
    assert_eq!(held(&rows, "leak_small_blocks"), (9, 27000), "{stdout}");
    for d in ["/var/tmp/memtrace", "/tmp/memtrace"] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// A container-like process (its own mount namespace and root, pivoted onto
/// a tmpfs) whose /tmp is an absolute symlink to a host directory: root's
/// copy through /proc/PID/root/tmp would land on the host. memleak -p
/// writes nothing there, and still traces it exactly (a sealed memfd of the
/// process's own).
#[test]
fn a_container_s_symlinks_never_lead_a_write_onto_the_host() {
    if !installed("unshare", "--help") {
        return skip("rootsafe", "no unshare");
    }
    let victim = scratch_dir("rootsafe", "victim");
    let bin = workload_bin();
    let script = format!(
        "set -e; R=$(mktemp -d); mount -t tmpfs tmpfs $R; cd $R; \
         mkdir usr w old proc; mount --bind /usr usr; \
         ln -s usr/lib lib; ln -s usr/lib64 lib64; ln -s usr/bin bin; ln -s usr/sbin sbin; \
         mount --bind {wdir} w; ln -s {victim} tmp; \
         pivot_root . old; mount -t proc proc /proc; umount -l /old; \
         exec /w/{name} --wait got-watch 7 1000",
        wdir = bin.parent().unwrap().display(),
        name = bin.file_name().unwrap().to_string_lossy(),
        victim = victim.display(),
    );
    let mut c = Command::new("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c", &script]);
    let mut w = Workload::spawn(c);
    let pid = w.pid.to_string();
    w.send("go");
    assert_eq!(w.line().trim(), "ready");
    let t = Tracer::start(&["memleak", "-p", &pid, "--json", "-v"]);
    w.send("during");
    assert_eq!(w.line().trim(), "during changed");
    t.signal(libc::SIGINT);
    let out = t.wait(Duration::from_secs(20));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("a sealed memfd of its own"),
        "{}",
        out.stderr
    );
    let rows = json_of(&out.stdout, "memleak");
    assert_eq!(
        held(&rows, "leak_small_blocks"),
        (7, 7000),
        "{}",
        out.stdout
    );
    let written: Vec<_> = std::fs::read_dir(&victim).unwrap().flatten().collect();
    assert!(written.is_empty(), "written on the host: {written:?}");
    w.go();
    assert!(w.wait().success());
    let _ = std::fs::remove_dir_all(victim);
}

/// The probe a `memleak -c` command runs: it asks memtrace's memo socket
/// itself and says what it got and could do with it (`memo-probe.py`).
fn memo_probe(as_user: Option<&str>) -> String {
    // A copy any user can read (the checkout may be in root's home).
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("workload/memo-probe.py");
    let py = scratch_dir("rootsafe", "memo").join("memo-probe.py");
    std::fs::copy(src, &py).unwrap();
    std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cmd = match as_user {
        Some(u) => format!(
            "setpriv --reuid={u} --regid={u} --clear-groups /usr/bin/python3 {}",
            py.display()
        ),
        None => format!("/usr/bin/python3 {}", py.display()),
    };
    let out = run_with(&["memleak", "-c", &cmd], Duration::from_secs(60));
    assert_eq!(out.code, 0, "{}", out.stderr);
    out.stdout
}

/// Inside a `memleak -c` tree: the memo's descriptors reach root's
/// processes only, map read-only only (a writable mapping is refused), and
/// no bpf-map mapping of the command's is writable.
#[test]
fn the_memo_maps_read_only_and_reaches_root_s_processes_only() {
    if !installed("/usr/bin/python3", "--version") {
        return skip("rootsafe", "no python3");
    }
    let root = memo_probe(None);
    assert!(root.contains("fds 2"), "{root}");
    assert!(root.contains("writable refused"), "{root}");
    assert!(root.contains("read-only ok"), "{root}");
    assert!(root.contains("bpf-map writable mappings 0"), "{root}");
    // The shim's own mappings, gone in a forked worker that drops root.
    assert!(!root.contains("memo mappings before setuid 0"), "{root}");
    assert!(root.contains("memo mappings after setuid 0"), "{root}");
    // Another user in the same tree gets nothing.
    let nobody = memo_probe(Some("65534"));
    assert!(nobody.contains("fds 0"), "{nobody}");
}

/// The shim memtrace wrote for a run: root's, readable, written by no one,
/// in a directory no one else writes.
#[test]
fn the_shim_file_is_root_s_and_written_by_no_one() {
    let out = run_with(
        &[
            "memleak",
            "-v",
            "-c",
            "sh -c 'grep memtrace-preload /proc/$$/maps | head -1'",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let shim = out
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("memtrace: memleak: allocator shim: "))
        .and_then(|l| l.split(" (").next())
        .unwrap_or_else(|| panic!("{}", out.stderr));
    assert!(out.stdout.contains(shim), "{}", out.stdout);
    // Removed at exit; while it ran, its directory was root's.
    assert!(!Path::new(shim).exists());
    let dir = Path::new(shim).parent().unwrap();
    if let Ok(m) = std::fs::metadata(dir) {
        assert_eq!(m.uid(), 0);
        assert_eq!(m.mode() & 0o022, 0, "{:o}", m.mode());
    }
}

/// A program that runs its child with LD_PRELOAD removed (`env -i`) is
/// obeyed: the child does not get the shim put back, and memtrace says how
/// many children it lost that way.
#[test]
fn a_child_whose_environment_dropped_ld_preload_is_obeyed_and_counted() {
    let cmd = format!("env -i {} leak 9 3000 0 0 10", workload_bin().display());
    let out = run_with(&["memleak", "--json", "-c", &cmd], Duration::from_secs(60));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s = json_of(&out.stdout, "summary")[0].clone();
    assert_eq!(s["children_unpreloaded"].as_u64(), Some(1), "{s}");
    assert!(out.stderr.contains("LD_PRELOAD removed"), "{}", out.stderr);
    let rows = json_of(&out.stdout, "memleak");
    assert_eq!(held(&rows, "leak_small_blocks"), (0, 0), "{}", out.stdout);
}
