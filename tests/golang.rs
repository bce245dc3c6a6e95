//! Go programs (built here with the host's Go toolchain, Debian's
//! `golang-go`): whole stacks by default, though Go writes no `.eh_frame`
//! for its code, and a stripped binary walked by its frame pointers.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::nofp::{at, sum, trace};
use common::*;

const TEST: &str = "golang";

/// The Go workload built with `ldflags` and build `tags` (None: no Go
/// toolchain here).
fn go_build(out: &str, ldflags: &str, tags: &str) -> Option<PathBuf> {
    if !installed("go", "version") {
        return None;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("workload/go");
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = tmp.join(TEST);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(out);
    let cache = tmp.join("go-cache");
    // Go takes its flags before the package: not nofp's `build`.
    let st = status_within(
        Command::new("go")
            .args(["build", "-tags", tags, "-ldflags", ldflags, "-o"])
            .arg(&path)
            .arg(".")
            .env("GOCACHE", &cache)
            .env("GOPATH", cache.join("path"))
            .env("GO111MODULE", "off")
            .env("CGO_ENABLED", "0")
            .current_dir(src),
        std::time::Duration::from_secs(300),
    );
    assert!(st.success(), "building {out} failed");
    Some(path)
}

fn hoard() -> Option<&'static Path> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| go_build("go-hoard", "", "")).as_deref()
}

/// With the runtime's heap profiling left on (it uses runtime/pprof).
fn hoard_profiled() -> Option<&'static Path> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| go_build("go-hoard-profiled", "", "profiled"))
        .as_deref()
}

fn hoard_stripped() -> Option<&'static Path> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| go_build("go-hoard-stripped", "-s -w", ""))
        .as_deref()
}

/// The fault stacks of a default `faults --stacks` run of `bin`, and the
/// summary.
fn fault_stacks(bin: &Path) -> (Vec<serde_json::Value>, serde_json::Value) {
    let cmd = format!("{} 1000", bin.display());
    let (out, summary) = trace(&["faults", "--stacks", "--json", "-c", &cmd]);
    (json_of(&out, "fault_stack"), summary)
}

/// A stack with no mark of an early stop.
fn whole(s: &serde_json::Value) -> bool {
    user_frames(s).iter().all(|f| !f.starts_with('[')) && s["note"].is_null()
}

/// Asserts that at least 95% of the faults `bin`'s hoard() took have a
/// whole stack through main.main and runtime.main to the goroutine's start.
fn whole_through_main(bin: &Path) {
    let (stacks, summary) = fault_stacks(bin);
    let hoarding: Vec<_> = stacks
        .iter()
        .filter(|s| {
            user_frames(s)
                .first()
                .is_some_and(|f| f.contains("main.hoard"))
        })
        .cloned()
        .collect();
    let n = sum(&hoarding, "count");
    // One fault per page, 16 pages a block: fewer where the kernel maps a
    // huge page at once, a few more where a fault waited for its page and
    // the kernel entered it again (VM_FAULT_RETRY, counted as bpftrace
    // counts it).
    assert!(n > 0 && n <= 16_160, "{n} faults in main.hoard: {summary}");
    let through: Vec<_> = hoarding
        .iter()
        .filter(|s| {
            let f = user_frames(s);
            let main = at(&f, "main.main");
            whole(s) && main.is_some_and(|m| at(&f, "runtime.main").is_some_and(|r| m < r))
        })
        .cloned()
        .collect();
    let whole_n = sum(&through, "count");
    assert!(
        whole_n * 100 >= n * 95,
        "{whole_n} of {n} faults in main.hoard have a whole stack through main.main and runtime.main: {hoarding:#?}"
    );
    // The walk ends at the goroutine's first frame, complete.
    for s in &through {
        let f = user_frames(s);
        assert!(f.last().unwrap().contains("runtime.goexit"), "{f:#?}");
    }
}

#[test]
fn go_fault_stacks_are_whole_by_default() {
    let Some(bin) = hoard() else {
        return skip(TEST, "no Go toolchain (golang-go)");
    };
    whole_through_main(bin);
}

/// `-ldflags=-s -w`: no symbols and no `.debug_frame`. Walked by frame
/// pointers, named from the runtime's own function table, and the choice
/// said for the binary in -v.
#[test]
fn a_stripped_go_binary_is_walked_by_frame_pointers_and_named() {
    let Some(bin) = hoard_stripped() else {
        return skip(TEST, "no Go toolchain (golang-go)");
    };
    whole_through_main(bin);
    let cmd = format!("{} 10", bin.display());
    let out = run(&["faults", "--stacks", "-v", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let name = bin.display().to_string();
    let said: Vec<_> = out
        .stderr
        .lines()
        .filter(|l| l.contains(&format!("{name}:")) && l.contains("frame pointers"))
        .collect();
    assert_eq!(said.len(), 1, "{}", out.stderr);
}

/// Blocks of 64 KiB hoard() keeps for memleak: Go samples one allocation
/// per 512 KiB on average, and this many make its estimate's spread a few
/// percent.
const BLOCKS: u64 = 4000;
const HELD: u64 = BLOCKS * 65536;

/// memleak -p on a running Go program, whose runtime `bin` profiles its
/// heap or not: its JSON output, once the blocks are held.
/// memleak `-p` (with `flags`) over `bin` hoarding: its output, and the
/// program's heap profile rate after memtrace ended.
fn memleak_p(bin: &Path, flags: &[&str]) -> (Output, u64) {
    let mut w = Workload::start_from(bin.as_os_str(), &[&BLOCKS.to_string()], |_| {});
    let pid = w.pid.to_string();
    let mut args = vec!["memleak", "--json", "-p", &pid];
    args.extend(flags);
    let t = Tracer::start(&args);
    w.send("go");
    assert_eq!(w.line().trim(), format!("held {BLOCKS}"));
    let out = t.interrupt();
    w.go();
    let rate = w.line();
    assert!(w.wait().success());
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rate = rate.trim().strip_prefix("rate ").expect("its rate");
    (out, rate.parse().unwrap())
}

/// Every Go heap row's title says `words`.
fn titles_say(stdout: &str, words: &str) {
    let rows = json_of(stdout, "go_heap");
    assert!(
        rows.iter()
            .all(|r| r["title"].as_str().unwrap().contains(words)),
        "{rows:#?}"
    );
}

/// Within 25% of what hoard() holds.
fn near_held(held: u64, out: &str) {
    assert!(
        held * 4 >= HELD * 3 && held * 4 <= HELD * 5,
        "{held} bytes of the Go heap under main.hoard, {HELD} held: {out}"
    );
}

/// The Go heap held under stacks through main.hoard, in bytes.
fn go_heap_in_hoard(stdout: &str) -> u64 {
    in_hoard(&json_of(stdout, "go_heap"))
}

fn in_hoard(rows: &[serde_json::Value]) -> u64 {
    rows.iter()
        .filter(|r| at(&user_frames(r), "main.hoard").is_some())
        .map(|r| r["bytes"].as_u64().unwrap())
        .sum()
}

/// Go's allocator calls no malloc: the Go heap in use comes from the
/// runtime's own profile, by Go function, within 25% of what hoard() holds,
/// and the runtime's reservations from the OS are not reported as held.
#[test]
fn memleak_p_reports_the_go_heap_by_function() {
    let Some(bin) = hoard_profiled() else {
        return skip(TEST, "no Go toolchain (golang-go)");
    };
    let (out, rate) = memleak_p(bin, &[]);
    near_held(go_heap_in_hoard(&out.stdout), &out.stdout);
    // The program's own profiling is left as it was.
    assert_eq!(rate, 512 * 1024);
    let reserved: Vec<_> = json_of(&out.stdout, "memleak")
        .into_iter()
        .filter(|r| user_frames(r).iter().any(|f| f.starts_with("runtime.sys")))
        .collect();
    assert!(reserved.is_empty(), "{reserved:#?}");
    // Said, with their bytes (at least the heap carved from them), and
    // the Go heap's total is its rows'.
    let summary = json_of(&out.stdout, "summary").pop().expect("a summary");
    let left = summary["arena_bytes_left_out"].as_u64().unwrap_or(0);
    assert!(left >= HELD, "{summary}");
    let rows: u64 = json_of(&out.stdout, "go_heap")
        .iter()
        .map(|r| r["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(summary["go_heap_bytes"].as_u64(), Some(rows), "{summary}");
    assert_eq!(summary["go_profile_rate"].as_u64(), Some(512 * 1024));
}

/// A Go program whose linker turned heap profiling off: memleak turns it
/// on (two words of the program written), reports the heap allocated from
/// then on, says so, and puts it back off at its exit.
#[test]
fn memleak_p_turns_on_the_go_heap_profile_the_linker_left_off() {
    let Some(bin) = hoard() else {
        return skip(TEST, "no Go toolchain (golang-go)");
    };
    let (out, rate) = memleak_p(bin, &[]);
    near_held(go_heap_in_hoard(&out.stdout), &out.stdout);
    titles_say(&out.stdout, "turned on by memtrace at");
    let said = out
        .stderr
        .lines()
        .filter(|l| l.contains("left heap profiling off"))
        .count();
    assert_eq!(said, 1, "{}", out.stderr);
    assert_eq!(rate, 0, "profiling not put back off");
}

/// `-c`: turned on before the runtime starts, the whole run is profiled.
#[test]
fn memleak_c_turns_the_go_heap_profile_on_before_the_program_starts() {
    let Some(bin) = hoard() else {
        return skip(TEST, "no Go toolchain (golang-go)");
    };
    let cmd = format!("{} {BLOCKS}", bin.display());
    let (out, _) = trace(&["memleak", "--json", "-c", &cmd]);
    near_held(go_heap_in_hoard(&out), &out);
    titles_say(&out, "before it started");
}

/// With --no-inject the program is left as it is: said in one line, not an
/// empty or arena-sized answer given as its heap.
#[test]
fn memleak_p_says_when_a_go_heap_cannot_be_read() {
    let Some(bin) = hoard() else {
        return skip(TEST, "no Go toolchain (golang-go)");
    };
    let (out, rate) = memleak_p(bin, &["--no-inject"]);
    assert_eq!(rate, 0);
    assert_eq!(go_heap_in_hoard(&out.stdout), 0);
    let said: Vec<_> = out
        .stderr
        .lines()
        .filter(|l| l.contains("is a Go program") && l.contains("profiling is off"))
        .collect();
    assert_eq!(said.len(), 1, "{}", out.stderr);
}

/// `-c`: the command is followed under ptrace to its exit, where its
/// memory is still mapped: the Go heap is read there, however short the
/// program lives.
#[test]
fn memleak_c_reads_the_go_heap_as_the_command_exits() {
    let Some(bin) = hoard_profiled() else {
        return skip(TEST, "no Go toolchain (golang-go)");
    };
    let cmd = format!("{} {BLOCKS}", bin.display());
    let (out, summary) = trace(&["memleak", "--json", "-c", &cmd]);
    let held = go_heap_in_hoard(&out);
    assert!(
        held * 4 >= HELD * 3 && held * 4 <= HELD * 5,
        "{held} bytes of the Go heap under main.hoard, {HELD} held: {out}"
    );
    titles_say(&out, "as read at its exit");
    assert!(
        summary["arena_bytes_left_out"].as_u64().unwrap_or(0) >= HELD,
        "{summary}"
    );
}

/// A Go program growing 2 MiB every 100 ms in a memory cgroup of 96 MiB
/// until it is OOM-killed, with `args` tracing it (`GROUP` stands for the
/// group's path): the victim's Go heap at the kill is in its report, by Go
/// function (read from its profile at most about a second before the kill,
/// so some 20 MiB short of the group's limit at worst), and its runtime's
/// reservations are not in the allocator-level section `kind`.
fn victims_go_heap(test: &str, args: &[&str], kind: &str) {
    use std::os::unix::process::ExitStatusExt;
    let Some(bin) = hoard_profiled() else {
        return skip(test, "no Go toolchain (golang-go)");
    };
    if memcg_root().is_none() {
        return skip(test, "no memory cgroup controller (v1 or v2)");
    }
    const MIB: u64 = 1 << 20;
    let cg = Memcg::new(&test[..8], "96M");
    let group = format!("/{}", cg.name);
    let args: Vec<&str> = args
        .iter()
        .map(|a| if *a == "GROUP" { group.as_str() } else { a })
        .collect();
    let mut tracer = Tracer::start(&args);
    let mut child = cg
        .command(bin)
        .arg("--grow")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let st = wait_child(&mut child, WAIT);
    assert_eq!(st.signal(), Some(libc::SIGKILL), "not OOM-killed: {st:?}");
    let pid = child.id();
    let victim = format!("\"pid\":{pid},");
    let seen = tracer.stdout_line(|l| l.contains("\"go_heap\"") && l.contains(&victim), WAIT);
    let out = tracer.interrupt();
    assert!(seen.is_some(), "no Go heap of the victim: {}", out.stdout);
    let rows: Vec<_> = json_of(&out.stdout, "go_heap")
        .into_iter()
        .filter(|r| r["pid"] == pid)
        .collect();
    let held = in_hoard(&rows);
    assert!(
        (40 * MIB..=120 * MIB).contains(&held),
        "{} MiB of the Go heap under main.hoard: {rows:#?}",
        held / MIB
    );
    let reserved: u64 = json_of(&out.stdout, kind)
        .iter()
        .filter(|r| r["pid"] == pid)
        .map(|r| r["bytes"].as_u64().unwrap_or(0))
        .sum();
    assert!(
        reserved < 16 * MIB,
        "{reserved} bytes of reservations held: {}",
        out.stdout
    );
}

#[test]
fn memcg_heap_shows_the_go_heap_an_oom_victim_held() {
    victims_go_heap(
        "memcg_heap_shows_the_go_heap_an_oom_victim_held",
        &["memcg", "--cgroup", "GROUP", "--heap", "--json"],
        "memcg_oom_heap",
    );
}

#[test]
fn oomkill_heap_shows_the_go_heap_an_oom_victim_held() {
    victims_go_heap(
        "oomkill_heap_shows_the_go_heap_an_oom_victim_held",
        &["oomkill", "--heap", "--json"],
        "oom_heap",
    );
}
