//! `memtrace top`: plain-text and JSON refreshes against workloads with
//! known rates, and the full-screen table under a terminal (tmux).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// Sum over the refreshes of `col` (a rate) times each one's interval.
fn counted(rows: &[serde_json::Value], col: &str) -> f64 {
    rows.iter()
        .map(|r| r[col].as_f64().unwrap() * r["interval_s"].as_f64().unwrap())
        .sum()
}

/// Every refresh's rates times its interval add up to the workload's
/// counts (exact, whatever the host's timing), the last part-interval
/// included: top ends when its process does and prints what came since.
#[test]
fn refreshes_add_up_to_the_counts_of_a_paced_workload() {
    // 2000 faults and 200 brk calls a second, for 3 s.
    const FAULTS: f64 = 6000.0;
    const BRKS: f64 = 600.0;
    let mut w = Workload::start(&["paced", "2000", "200", "3"]);
    let pid = w.pid;
    // Refreshes of 700 ms: the run's last 200 ms are a part-interval.
    let t = Tracer::start(&["top", "-p", &pid.to_string(), "-i", "700ms", "--json"]);
    w.go();
    assert!(w.wait().success());
    let out = t.wait(Duration::from_secs(30));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let all = json_of(&out.stdout, "top");
    // Only the traced process is shown.
    assert!(all.iter().all(|r| r["pid"] == pid), "{all:?}");
    assert!(all.len() >= 5, "3 s in refreshes of 700 ms: {all:?}");
    let near = |what: &str, got: f64, want: f64, more: f64| {
        assert!(
            (want - 0.5..=want + more + 0.5).contains(&got),
            "{what}: {got:.2} over the refreshes, expected {want} (+{more}): {all:?}"
        );
    };
    // Its way out may touch a few pages more (exit's own).
    near("faults", counted(&all, "faults_user_s"), FAULTS, 16.0);
    near("brk calls", counted(&all, "brk_s"), BRKS, 0.0);
    // A page each.
    near("brk KiB", counted(&all, "brk_kb_s"), BRKS * 4.0, 0.0);
    // Each fault a fresh page it keeps: resident memory grows by them in
    // each refresh after the first (the first reading of a process has no
    // growth) while the process lives.
    for r in all
        .iter()
        .skip(1)
        .filter(|r| r["rss_anon_kb"].as_u64() > Some(0))
    {
        let (rss, flt) = (
            r["rss_kb_s"].as_f64().unwrap(),
            r["faults_user_s"].as_f64().unwrap(),
        );
        assert!(
            (flt * 4.0 * 0.9..=flt * 4.0 * 1.1).contains(&rss),
            "RSS growth {rss} KiB/s at {flt} faults/s: {r}"
        );
    }
    for r in &all {
        assert_eq!(r["comm"], "memtrace-worklo");
    }
    // The OOM killer's score of a live process is a number.
    assert!(all[0]["oom_score"].as_u64().is_some(), "{}", all[0]);
}

#[test]
fn plain_text_when_stdout_is_not_a_terminal_and_count_ends_it() {
    let started = Instant::now();
    // -d is the refresh delay, as procps top has it.
    let out = run(&["top", "-d", "300ms", "-n", "3", "--top", "5"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let headers = out
        .stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("PID COMM") && l.contains("FLT/s"))
        .count();
    assert_eq!(headers, 3, "{}", out.stdout);
    assert!(out.stdout.contains("sorted by faults"), "{}", out.stdout);
    // The host's memory on every refresh: available, swap, pressure.
    let heads = out.stdout.lines().filter(|l| l.contains(" top: ")).count();
    let mem = out
        .stdout
        .lines()
        .filter(|l| {
            l.contains("mem available ") && l.contains(" swap used ") && l.contains(" pressure ")
        })
        .count();
    assert_eq!((heads, mem), (3, 3), "{}", out.stdout);
    assert!(started.elapsed() < Duration::from_secs(30));
    // No terminal escapes in plain text.
    assert!(!out.stdout.contains('\x1b'), "{:?}", out.stdout);
}

/// A tmux server of our own, killed however the test ends.
struct Tmux(String);

impl Tmux {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.0]).args(args);
        // The server outlives this call: it must not keep descriptors we
        // inherited (cargo's build lock, held by `flock`, among them).
        unsafe {
            use std::os::unix::process::CommandExt;
            c.pre_exec(|| {
                libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
                Ok(())
            });
        }
        c
    }

    /// A detached session `top` of WIDTH x HEIGHT cells running `cmd`.
    fn start(&self, (width, height): (u16, u16), cmd: &str) {
        let (w, h) = (width.to_string(), height.to_string());
        let st = self
            .cmd(&["new-session", "-d", "-s", "top", "-x", &w, "-y", &h, cmd])
            .status()
            .unwrap();
        assert!(st.success());
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]).status();
    }
}

/// The screen of a tmux pane.
fn pane(t: &Tmux) -> String {
    let o = t
        .cmd(&["capture-pane", "-p", "-t", "top"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn wait_pane(t: &Tmux, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let p = pane(t);
        if pred(&p) {
            return p;
        }
        assert!(Instant::now() < deadline, "{what} never showed:\n{p}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The pid of the first row of the table.
fn first_row_pid(screen: &str) -> Option<u32> {
    let mut lines = screen
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("PID"));
    lines.next()?;
    lines.next()?.split_whitespace().next()?.parse().ok()
}

/// Whether tmux is installed; skips `test` (saying why) if not.
fn tmux_here(test: &str) -> bool {
    let has = installed("tmux", "-V");
    if !has {
        skip(test, "tmux is not installed");
    }
    has
}

#[test]
fn full_screen_sorts_opens_stacks_and_quits_on_q_detached() {
    if !tmux_here("full_screen_sorts_opens_stacks_and_quits_on_q_detached") {
        return;
    }
    let before = settled_programs();
    // A brk leader and a fault leader, each first under its own sort only
    // (shown alone with the filter: builds on the host fault more).
    let mut w = Workload::start(&["paced", "0", "3000", "20"]);
    let mut f = Workload::start(&["paced", "2000", "0", "20"]);
    w.go();
    f.go();
    let t = Tmux(format!("memtrace-test-{}", std::process::id()));
    let cmd = format!(
        "{} top -i 500ms --filter memtrace-worklo; echo exited=$?; sleep 30",
        memtrace_bin().display()
    );
    t.start((200, 40), &cmd);
    let screen = wait_pane(&t, "the table sorted by faults", |p| {
        p.contains("BRK/s") && p.contains("[f]faults*") && first_row_pid(p) == Some(f.pid)
    });
    assert!(screen.contains("sort: faults"), "{screen}");
    t.cmd(&["send-keys", "-t", "top", "b"]).status().unwrap();
    let screen = wait_pane(&t, "brk sort", |p| {
        p.contains("[b]brk*") && first_row_pid(p) == Some(w.pid)
    });
    assert!(screen.contains("sort: brk"), "{screen}");
    // Enter on the first row: its heap-growth stack, by function.
    t.cmd(&["send-keys", "-t", "top", "Enter"])
        .status()
        .unwrap();
    wait_pane(&t, "its stacks", |p| {
        p.contains(&format!("pid {}", w.pid))
            && p.contains("heap-growth (brk) stacks")
            && p.contains("paced::raw_brk")
    });
    t.cmd(&["send-keys", "-t", "top", "Escape"])
        .status()
        .unwrap();
    wait_pane(&t, "the details closed", |p| !p.contains("heap-growth"));
    t.cmd(&["send-keys", "-t", "top", "q"]).status().unwrap();
    let screen = wait_pane(&t, "the exit", |p| p.contains("exited="));
    drop(t);
    let _ = w.child.kill();
    let _ = f.child.kill();
    assert!(screen.contains("exited=0"), "{screen}");
    // The terminal is back: the table is gone with the alternate screen.
    assert!(!screen.contains("q:quit"), "{screen}");
    // Nothing of memtrace stays attached.
    assert_programs_back_to(before);
}

/// At 80 columns the table gives numbers units and leaves whole columns
/// out, and says so; a number is never cut: a process with tens of
/// megabytes of anonymous memory shows them as /proc says (205,700 kB was
/// shown as `2057` when columns were cut to their width).
#[test]
fn a_narrow_terminal_drops_columns_and_never_cuts_a_number() {
    if !tmux_here("a_narrow_terminal_drops_columns_and_never_cuts_a_number") {
        return;
    }
    // 4,000 fresh pages a second, kept: 16 MB a second of anon memory.
    let mut w = Workload::start(&["paced", "4000", "0", "20"]);
    w.go();
    let t = Tmux(format!("memtrace-narrow-{}", std::process::id()));
    let cmd = format!(
        "{} top -d 500ms --sort anon --filter {}; sleep 30",
        memtrace_bin().display(),
        w.pid
    );
    t.start((80, 24), &cmd);
    // Its row once it holds more than 30 MB: whole kilobytes under ANON_KB,
    // or with a unit (K, M, G: binary) under ANON.
    let anon_of = |p: &str| -> Option<u64> {
        let row = p
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&w.pid.to_string()))?;
        let cell = row.split_whitespace().nth(2)?;
        let (num, kb) = match cell.char_indices().last()? {
            (i, 'K') => (&cell[..i], 1.0),
            (i, 'M') => (&cell[..i], 1024.0),
            (i, 'G') => (&cell[..i], 1024.0 * 1024.0),
            _ => (cell, 1.0),
        };
        let header = p.lines().find(|l| l.contains(" ANON"))?;
        let with_unit = cell.ends_with(['K', 'M', 'G']);
        // The header says which: no unit on a KB column, no bare number
        // on a column whose header lost its _KB.
        if with_unit == header.contains("ANON_KB") {
            return None;
        }
        Some((num.parse::<f64>().ok()? * kb) as u64)
    };
    let screen = wait_pane(&t, "its row past 30 MB", |p| {
        anon_of(p).is_some_and(|kb| kb > 30_000)
    });
    let shown = anon_of(&screen).unwrap();
    let status = std::fs::read_to_string(format!("/proc/{}/status", w.pid)).unwrap();
    let rss_anon: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    // Half a second of growth (8 MB) apart at most, never a tenth of it.
    assert!(
        shown.abs_diff(rss_anon) < 12_000,
        "shown {shown} kB, /proc {rss_anon} kB:\n{screen}"
    );
    assert!(screen.contains("columns hidden"), "{screen}");
    assert!(screen.lines().all(|l| l.chars().count() <= 80), "{screen}");
    drop(t);
    let _ = w.child.kill();
}
