//! `memtrace oomkill` against a real memcg OOM kill.

mod common;

use std::time::Duration;

use common::*;

/// Skips (printing why) where no memory cgroup can be made.
fn memcg_here(test: &str) -> bool {
    memcg_root().is_some() || {
        skip(test, "no memory cgroup controller (v1 or v2)");
        false
    }
}

fn oom_in_memcg(
    extra: &[&str],
) -> (
    serde_json::Value,
    Vec<serde_json::Value>,
    u32,
    String,
    String,
) {
    let cg = Memcg::new("oom", "64M");
    let mut args = vec!["oomkill", "--json"];
    args.extend_from_slice(extra);
    let mut tracer = Tracer::start(&args);
    let mut child = cg
        .command(&workload_bin())
        .args(["alloc", "200"])
        .spawn()
        .unwrap();
    let victim = child.id();
    let st = wait_child(&mut child, WAIT);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        st.signal(),
        Some(libc::SIGKILL),
        "workload was not OOM-killed: {st:?}"
    );
    if extra.contains(&"-p") {
        // The kill must not be shown: there is no line to wait for.
        std::thread::sleep(Duration::from_millis(500));
    } else {
        tracer.record("oom_kill", |k| k["victim_pid"] == victim, WAIT);
    }
    let out = tracer.interrupt();
    assert_eq!(out.code, 0, "{}", out.stderr);
    let kills = json_of(&out.stdout, "oom_kill");
    let summary = json_of(&out.stdout, "summary").pop().expect("summary");
    (summary, kills, victim, cg.name.clone(), out.stdout)
}

fn check_kill(kills: &[serde_json::Value], victim: u32, cg: &str) {
    let ours: Vec<_> = kills.iter().filter(|k| k["victim_pid"] == victim).collect();
    assert_eq!(
        ours.len(),
        1,
        "expected exactly one kill of {victim}: {kills:?}"
    );
    let k = ours[0];
    assert_eq!(k["victim_comm"], "memtrace-worklo");
    assert!(k["anon_rss_kb"].as_u64().unwrap() > 32 * 1024, "{k}");
    assert_eq!(k["memcg"], format!("/{cg}"));
    // The victim's own group set the limit.
    assert_eq!(k["limit_at"], format!("/{cg}"), "{k}");
    assert_eq!(k["limit_kb"], 64 * 1024, "{k}");
    // 64 MiB limit in 4 KiB pages.
    assert_eq!(k["pages"], 16384, "{k}");
    assert!(k["loadavg"].as_str().unwrap().split(' ').count() == 4);
}

#[test]
fn reports_one_memcg_kill_with_victim_rss_and_cgroup() {
    if !memcg_here("reports_one_memcg_kill_with_victim_rss_and_cgroup") {
        return;
    }
    let (summary, kills, victim, cg, _) = oom_in_memcg(&[]);
    check_kill(&kills, victim, &cg);
    assert_eq!(summary["lost_total"], 0);
    assert!(summary["attached"][0]["method"].is_string());
}

#[test]
fn classic_tracepoint_fallback_reports_the_same() {
    if !memcg_here("classic_tracepoint_fallback_reports_the_same") {
        return;
    }
    let (summary, kills, victim, cg, _) = oom_in_memcg(&["--attach", "tracepoint"]);
    assert_eq!(summary["attached"][0]["method"], "tracepoint");
    check_kill(&kills, victim, &cg);
}

#[test]
fn stack_option_symbolizes_the_trigger_of_another_process_kill() {
    use std::os::unix::process::CommandExt;
    if !memcg_here("stack_option_symbolizes_the_trigger_of_another_process_kill") {
        return;
    }
    // The victim holds 40 MiB and volunteers (oom_score_adj 1000); the trigger
    // then allocates 40 MiB more in the same 64 MiB memcg and survives.
    let cg = Memcg::new("oomstack", "64M");
    let mut tracer = Tracer::start(&["oomkill", "--json", "--stack"]);
    let mut holder = cg.command(&workload_bin());
    holder
        .args(["hold", "40"])
        .stdout(std::process::Stdio::piped());
    unsafe {
        holder.pre_exec(|| std::fs::write("/proc/self/oom_score_adj", "1000"));
    }
    let mut holder = holder.spawn().unwrap();
    let line = lines_of(holder.stdout.take().unwrap()).recv_timeout(WAIT);
    assert_eq!(line.as_deref(), Ok("ready"));
    // The trigger stays alive after the kill, as a server would.
    let mut trigger = cg
        .command(&workload_bin())
        .args(["hold", "40"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let trigger_pid = trigger.id();
    let line = lines_of(trigger.stdout.take().unwrap()).recv_timeout(WAIT);
    assert_eq!(
        line.as_deref(),
        Ok("ready"),
        "the trigger was killed instead"
    );
    wait_child(&mut holder, WAIT);
    // The kill's stack is printed after the kill itself.
    tracer.record("oom_stack", |_| true, WAIT);
    let out = tracer.interrupt();
    let _ = trigger.kill();
    wait_child(&mut trigger, WAIT);
    let kills = json_of(&out.stdout, "oom_kill");
    assert_eq!(kills.len(), 1, "{}", out.stdout);
    assert_eq!(kills[0]["victim_pid"], holder.id());
    assert_eq!(kills[0]["trigger_pid"], trigger_pid);
    let stacks = json_of(&out.stdout, "oom_stack");
    assert_eq!(stacks.len(), 1, "{}", out.stdout);
    let frames = |k: &str| -> Vec<String> {
        stacks[0][k]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap().to_string())
            .collect()
    };
    let kernel = frames("kernel_stack");
    // The kernel path runs through the OOM killer.
    assert!(
        kernel.iter().any(|f| f.starts_with("out_of_memory")),
        "{kernel:?}"
    );
    let user = frames("user_stack");
    assert!(
        user.iter().any(|f| f.contains("allocate_and_touch_mib")),
        "{user:?}"
    );
    // Said plainly: these frames are the trigger's, the victim's were out of reach.
    assert_eq!(kills[0]["stack_of"], "trigger", "{}", out.stdout);
    assert_eq!(stacks[0]["pid"], trigger_pid);
    let note = stacks[0]["note"].as_str().unwrap_or("");
    assert!(
        note.contains("victim's own stack is unreachable")
            && note.contains(&holder.id().to_string()),
        "{}",
        out.stdout
    );
    let summary = json_of(&out.stdout, "summary").pop().expect("summary");
    assert!(
        summary["victim_stack_unreachable"].as_u64() >= Some(1),
        "{summary}"
    );
}

/// A victim that triggered its own kill, allocating in
/// `allocate_and_touch_mib`: its own user stack, by the given stack mode.
/// Returns the summary.
fn victims_own_stack(mode: &[&str]) -> serde_json::Value {
    let mut args = vec!["--stack"];
    args.extend_from_slice(mode);
    let (summary, kills, victim, _, out) = oom_in_memcg(&args);
    let k = kills
        .iter()
        .find(|k| k["victim_pid"] == victim)
        .unwrap_or_else(|| panic!("no kill of {victim}: {out}"));
    assert_eq!(k["trigger_pid"], victim, "{k}");
    assert_eq!(k["stack_of"], "victim", "{k}");
    let stack = json_of(&out, "oom_stack")
        .into_iter()
        .find(|s| s["pid"] == victim)
        .unwrap_or_else(|| panic!("no stack of {victim}: {out}"));
    assert!(
        stack["title"]
            .as_str()
            .unwrap_or("")
            .contains("victim's stack"),
        "{stack}"
    );
    assert!(stack["note"].is_null(), "{stack}");
    let user: Vec<&str> = stack["user_stack"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f.as_str())
        .collect();
    assert!(
        user.iter().any(|f| f.contains("allocate_and_touch_mib")),
        "{stack}"
    );
    assert!(summary["victim_stacks"].as_u64() >= Some(1), "{summary}");
    summary
}

#[test]
fn stack_of_a_victim_that_triggered_its_kill_is_its_own() {
    if !memcg_here("stack_of_a_victim_that_triggered_its_kill_is_its_own") {
        return;
    }
    // oomkill's default: a copied stack, unwound by DWARF (kills are rare).
    let summary = victims_own_stack(&[]);
    assert_eq!(summary["unwinder"], "copy", "{summary}");
    // The kernel's frame-pointer walk.
    victims_own_stack(&["--stack-mode", "fp"]);
    // Unwound in the kernel program, with the victim's table read at its
    // exec (it starts after memtrace).
    let summary = victims_own_stack(&["--stack-mode", "dwarf", "--unwinder", "kernel"]);
    assert_eq!(summary["unwinder"], "kernel", "{summary}");
    assert_eq!(summary["kunwind_fp_walked"], 0, "{summary}");
}

#[test]
fn pid_keeps_the_kills_of_that_process_only() {
    if !memcg_here("pid_keeps_the_kills_of_that_process_only") {
        return;
    }
    // A process that is neither victim nor trigger: its kills are none.
    let mut bystander = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = bystander.id().to_string();
    let (_, kills, victim, _, out) = oom_in_memcg(&["-p", &pid]);
    let _ = bystander.kill();
    let _ = bystander.wait();
    assert!(
        kills.iter().all(|k| k["victim_pid"] != victim),
        "a kill of {victim} shown for -p {pid}: {out}"
    );
}

#[test]
fn a_kill_under_a_limit_set_on_the_parent_names_the_parent() {
    use std::os::unix::process::CommandExt;
    if !memcg_here("a_kill_under_a_limit_set_on_the_parent_names_the_parent") {
        return;
    }
    let cg = Memcg::new("oomparent", "64M");
    let kid = cg.path.join("kid");
    std::fs::create_dir_all(&kid).unwrap();
    let mut tracer = Tracer::start(&["oomkill", "--json"]);
    let procs = kid.join("cgroup.procs");
    let mut cmd = std::process::Command::new(workload_bin());
    cmd.args(["alloc", "200"]);
    // SAFETY: only a write(2) between fork and exec.
    unsafe {
        cmd.pre_exec(move || std::fs::write(&procs, format!("{}", std::process::id())));
    }
    let mut child = cmd.spawn().unwrap();
    let victim = child.id();
    wait_child(&mut child, WAIT);
    tracer.record("oom_kill", |k| k["victim_pid"] == victim, WAIT);
    let out = tracer.interrupt();
    for _ in 0..50 {
        if std::fs::remove_dir(&kid).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let kills = json_of(&out.stdout, "oom_kill");
    let k = kills
        .iter()
        .find(|k| k["victim_pid"] == victim)
        .unwrap_or_else(|| panic!("no kill of {victim}: {}", out.stdout));
    assert_eq!(k["memcg"], format!("/{}/kid", cg.name), "{k}");
    assert_eq!(k["limit_at"], format!("/{}", cg.name), "{k}");
    assert_eq!(k["limit_kb"], 64 * 1024, "{k}");
}
