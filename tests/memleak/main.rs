//! `memtrace memleak`: exactly what a workload leaks, by stack, with `-c`
//! and `-p`; age and phase filters; kernel mode; a full table reported.

#[path = "../common/mod.rs"]
mod common;
mod fast_paths;
mod sampling;
mod tables;

use std::time::Duration;

use common::*;

const K: u64 = 7;
const SIZE: u64 = 1000;
const M: u64 = 3;
const BIG: u64 = 1 << 20;

fn lost(stdout: &str, what: &str) -> u64 {
    json_of(stdout, "summary")[0]["lost"][what]
        .as_u64()
        .unwrap()
}

fn leak_args(linger_ms: u64) -> Vec<String> {
    [
        "leak".to_string(),
        K.to_string(),
        SIZE.to_string(),
        M.to_string(),
        BIG.to_string(),
        "200".into(),
        linger_ms.to_string(),
    ]
    .to_vec()
}

fn assert_exact(stdout: &str) {
    let rows = json_of(stdout, "memleak");
    assert_eq!(held(&rows, "leak_small_blocks"), (K, K * SIZE), "{stdout}");
    assert_eq!(held(&rows, "leak_big_blocks"), (M, M * BIG), "{stdout}");
    // 200 rounds through every allocation function, all freed.
    assert_eq!(held(&rows, "churn_and_free"), (0, 0), "{stdout}");
    assert_eq!(lost(stdout, "missed_return"), 0, "{stdout}");
    assert_eq!(lost(stdout, "map_full"), 0, "{stdout}");
}

/// Whether this kernel attaches uprobe sessions (Linux 6.13).
fn has_sessions() -> bool {
    std::fs::read_to_string("/proc/kallsyms").is_ok_and(|s| s.contains(" bpf_session_is_return"))
}

fn exact_by_command(extra: &[&str]) -> Output {
    let cmd = format!("{} {}", workload_bin().display(), leak_args(0).join(" "));
    let mut argv = vec!["memleak", "-v", "--json", "--top", "50", "-c", &cmd];
    argv.extend_from_slice(extra);
    let out = run(&argv);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_exact(&out.stdout);
    out
}

#[test]
fn a_command_s_leaks_are_reported_exactly_by_stack() {
    // A -c command gets the preloaded shim by default.
    let out = exact_by_command(&[]);
    assert!(
        out.stderr
            .lines()
            .any(|l| l.contains("allocations (preloaded shim): attached uprobe")),
        "{}",
        out.stderr
    );
    let summary = &json_of(&out.stdout, "summary")[0];
    assert_eq!(summary["preloaded_processes"], 1, "{}", out.stdout);
}

#[test]
fn uprobes_on_the_allocator_are_exact_too() {
    let out = exact_by_command(&["--no-preload"]);
    // -v names the way chosen: the session where the kernel has them.
    let way = if has_sessions() {
        "attached uprobe_session "
    } else {
        "attached uprobe "
    };
    assert!(
        out.stderr
            .lines()
            .any(|l| l.contains("allocator calls and returns") && l.contains(way)),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("preloaded shim"), "{}", out.stderr);
}

#[test]
fn the_uprobe_and_uretprobe_fallback_is_exact_too() {
    let out = exact_by_command(&["--no-preload", "--no-uprobe-session"]);
    assert!(
        out.stderr
            .contains("allocator calls and returns: attached uprobe "),
        "{}",
        out.stderr
    );
}

#[test]
fn a_running_process_s_leaks_are_reported_exactly_by_stack() {
    let args = leak_args(300);
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    // Uprobes on the allocator (tests/inject.rs has the shim loaded in).
    let out = trace_workload(&args, &[&["memleak", "--top", "50", "--no-inject"]]).remove(0);
    assert_exact(&out);
    // Every allocation function was seen: 200 rounds of six, and the leaks.
    let summary = &json_of(&out, "summary")[0];
    assert!(summary["frees"].as_u64().unwrap() >= 200 * 6, "{out}");
    // Where the kernel makes uprobe_multi links (6.6: its link info
    // function is in kallsyms), the frees are one link: one detach at the
    // end (a uprobe each took 1.8 s to detach for jemalloc's 14).
    let multi = std::fs::read_to_string("/proc/kallsyms")
        .is_ok_and(|s| s.contains(" bpf_uprobe_multi_link_attach"));
    let frees = summary["attached"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["probe"].as_str().unwrap().contains("frees"))
        .unwrap_or_else(|| panic!("no frees attached: {summary}"));
    if multi {
        assert_eq!(frees["method"], "uprobe_multi", "{summary}");
    }
}

#[test]
fn older_keeps_only_allocations_older_than_asked() {
    // K blocks, 1 s, K more from another function, 1 s, exit: at the end
    // the first are about 2 s old, the second about 1 s.
    let cmd = format!("{} phases {K} {SIZE} 1000", workload_bin().display());
    let out = run(&["memleak", "--json", "-o", "1500", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json_of(&out.stdout, "memleak");
    assert_eq!(
        held(&rows, "leak_small_blocks"),
        (K, K * SIZE),
        "{}",
        out.stdout
    );
    assert_eq!(
        held(&rows, "leak_in_second_phase"),
        (0, 0),
        "{}",
        out.stdout
    );
}

#[test]
fn usr1_reports_and_starts_a_new_phase() {
    let mut w = Workload::start(&["phases", &K.to_string(), &SIZE.to_string(), "0", "step"]);
    let pid = w.pid.to_string();
    let mut t = Tracer::start(&["memleak", "-p", &pid]);
    w.send("go");
    // Between the two leaks: the first is made, the second waits for the
    // new phase to start.
    assert_eq!(w.line().trim(), "first phase done");
    t.signal(libc::SIGUSR1);
    let phase = t.stderr_line(|l| l.contains("new phase"), WAIT);
    assert!(phase.is_some(), "no new phase: {}", t.early_stderr);
    w.go();
    assert!(w.wait().success());
    let out = t.wait(Duration::from_secs(20));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let reports: Vec<&str> = out
        .stdout
        .split("stacks with outstanding allocations")
        .skip(1)
        .collect();
    assert_eq!(reports.len(), 2, "{}", out.stdout);
    let (first, last) = (reports[0], reports[1]);
    assert!(first.contains("leak_small_blocks"), "{first}");
    assert!(!first.contains("leak_in_second_phase"), "{first}");
    assert!(!last.contains("leak_small_blocks"), "{last}");
    let line = format!("{} bytes in {K} allocations", K * SIZE);
    assert!(
        last.contains("leak_in_second_phase") && last.contains(&line),
        "{last}"
    );
}

/// `--progress` counts calls as the run goes (it said "0 events" until the
/// final report).
#[test]
fn progress_counts_calls_before_the_report() {
    let cmd = format!("{} malloc-loop 1000 && sleep 2.5", workload_bin().display());
    let out = run(&["memleak", "--json", "--progress", "1", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let counts = progress_counts(&out.stderr);
    let summary = &json_of(&out.stdout, "summary")[0];
    let events = summary["events"].as_u64().unwrap();
    assert!(events >= 2000, "{summary}");
    // The last line comes after the loop's 1000 pairs (the shell and
    // sleep still allocate a little as they exit).
    let last = counts.last().copied().unwrap_or(0);
    assert!((2000..=events).contains(&last), "{last} {}", out.stderr);
}

/// Through the shim, `--stack-mode dwarf` unwinds in the kernel program:
/// blocks leaked three frames deep in C built without frame pointers have
/// their whole stack, where the frame-pointer walk skips the frameless
/// callers.
#[test]
fn dwarf_stacks_through_code_without_frame_pointers() {
    let bin = common::nofp::c_workload();
    let cmd = format!("{} leak 50", bin.display());
    let stack_of = |mode: &str| {
        let out = run(&["memleak", "-v", "--json", "--stack-mode", mode, "-c", &cmd]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let rows = json_of(&out.stdout, "memleak");
        let row = rows
            .iter()
            .find(|r| {
                r["user_stack"][0]
                    .as_str()
                    .is_some_and(|f| f.starts_with("leak_inner"))
            })
            .unwrap_or_else(|| panic!("no leak_inner stack: {}", out.stdout))
            .clone();
        assert_eq!(
            (row["count"].as_u64(), row["bytes"].as_u64()),
            (Some(50), Some(5000))
        );
        let frames: Vec<String> = row["user_stack"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap().to_string())
            .collect();
        (frames, out.stderr)
    };
    let (dwarf, stderr) = stack_of("dwarf");
    assert!(stderr.contains("unwound in the kernel"), "{stderr}");
    let named = |frames: &[String], f: &str| frames.iter().any(|x| x.starts_with(f));
    for f in ["leak_inner", "leak_middle", "leak_outer", "main"] {
        assert!(named(&dwarf, f), "{f} missing: {dwarf:?}");
    }
    let (fp, _) = stack_of("fp");
    assert!(!named(&fp, "leak_middle"), "{fp:?}");
}

/// A wrapper that allocates and then execs the program (a launcher script,
/// pyenv's shims): the wrapper's blocks went with its image, so only the
/// program's leaks are held, exactly.
#[test]
fn blocks_of_an_image_that_exec_d_away_are_not_held() {
    // bash allocates (its variables, the loop), then execs the workload.
    // (`v$i=$i` alone is no assignment: bash forked 200 children to run
    // it as a command, which failed, and their buffers stayed held at
    // their exit; frame-pointer stacks hid that they were bash's.)
    let cmd = format!(
        "bash -c 'for i in $(seq 200); do declare v$i=$i; done; exec {} {}'",
        workload_bin().display(),
        leak_args(0).join(" ")
    );
    let out = run(&["memleak", "--json", "--top", "50", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_exact(&out.stdout);
    let rows = json_of(&out.stdout, "memleak");
    let bash: Vec<_> = rows
        .iter()
        .filter(|r| r["user_stack"].to_string().contains("[bash]"))
        .collect();
    assert!(bash.is_empty(), "{bash:?}");
    let s = &json_of(&out.stdout, "summary")[0];
    assert!(s["blocks_gone_with_exec"].as_u64().unwrap() > 200, "{s}");
}

/// A simple command that starts the program in a process of its own (dash
/// vforks the program it is given): the processes it starts are traced as
/// the first one is. Only the first was probed, and the program's leaks
/// were missing with "0 lost".
#[test]
fn the_processes_a_simple_command_starts_are_traced_too() {
    let script = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("starts-the-leak.sh");
    let line = format!("{} {}", workload_bin().display(), leak_args(0).join(" "));
    // `sh FILE`, plain words for memtrace: the script's shell runs the
    // workload as a child and then says it is done.
    std::fs::write(&script, format!("{line}\necho started-and-done\n")).unwrap();
    let cmd = format!("sh {}", script.display());
    let out = run(&["memleak", "--json", "--top", "50", "-c", &cmd]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("started-and-done"), "{}", out.stdout);
    assert_exact(&out.stdout);
    let s = &json_of(&out.stdout, "summary")[0];
    assert_eq!(s["preloaded_processes"], 2, "{s}");
}

/// A statically linked program: the shim cannot be loaded into it, so its
/// own allocator (in the executable) is probed, and its leaks are exact.
/// Stripped, it has no malloc symbol: memleak says at start that its heap
/// cannot be seen, and names the process at the end (an empty report is
/// not "no leaks").
#[test]
fn a_static_program_s_own_allocator_is_probed_or_named_when_stripped() {
    let dir = std::env::temp_dir().join(format!("memtrace-static-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("st.c");
    std::fs::write(
        &src,
        "#include <stdlib.h>\n__attribute__((noinline)) void *leak_static(void){return malloc(1000);}\n\
         int main(void){for(int i=0;i<200;i++) if(!leak_static()) return 1; return 0;}\n",
    )
    .unwrap();
    let build = |name: &str, extra: &[&str]| {
        let bin = dir.join(name);
        let built = std::process::Command::new(std::env::var("CC").unwrap_or("cc".into()))
            .args(["-static", "-O1", "-g"])
            .args(extra)
            .arg("-o")
            .arg(&bin)
            .arg(&src)
            .status();
        built.is_ok_and(|s| s.success()).then_some(bin)
    };
    let (Some(bin), Some(stripped)) = (build("st", &[]), build("st-stripped", &["-s"])) else {
        let _ = std::fs::remove_dir_all(&dir);
        return skip(
            "a_static_program_s_own_allocator_is_probed_or_named_when_stripped",
            "no C compiler with a static libc",
        );
    };
    let out = run(&["memleak", "--json", "-c", bin.to_str().unwrap()]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("is statically linked: probing its own allocator"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("is not probed"), "{}", out.stderr);
    assert_eq!(
        held(&json_of(&out.stdout, "memleak"), "leak_static"),
        (200, 200_000)
    );
    // Started from a shell line it is not the command's program: the shim
    // loads into the shell, not into it, and nothing probes its allocator.
    // Said, with the way to see it.
    let line = format!("sh -c '{}; true'", bin.display());
    let out = run(&["memleak", "-c", &line]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "runs {}, which is statically linked: its own allocator is not probed",
            bin.display()
        )),
        "{}",
        out.stderr
    );
    let out = run(&["memleak", "-c", stripped.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("its heap cannot be seen"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("no allocator calls seen from PID"),
        "{}",
        out.stderr
    );
}
