//! memcg --prekill: systemd-oomd's Varlink prekill hook answered over a
//! local socket, with the group and its held heap.

use super::*;

/// One Varlink call as systemd-oomd makes it: a JSON object and a NUL,
/// the reply read to its NUL.
fn varlink_call(socket: &std::path::Path, call: serde_json::Value) -> serde_json::Value {
    use std::io::{Read, Write};
    let mut c = std::os::unix::net::UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut msg = call.to_string().into_bytes();
    msg.push(0);
    c.write_all(&msg).unwrap();
    let mut reply = Vec::new();
    let mut b = [0u8];
    while c.read(&mut b).unwrap() == 1 && b[0] != 0 {
        reply.push(b[0]);
    }
    serde_json::from_slice(&reply).unwrap_or_else(|e| panic!("{e}: {reply:?}"))
}

/// `--prekill`: memtrace listens where systemd-oomd (260+) looks for
/// prekill hooks, answers oomd's Notify call for a watched group after
/// describing the group, refuses other methods as Varlink says, and
/// removes its socket when it ends. oomd itself is played here: this
/// host's systemd has no prekill hook.
#[test]
fn prekill_calls_are_answered_after_the_group_is_described() {
    if !memcg_here("prekill_calls_are_answered_after_the_group_is_described") {
        return;
    }
    let cg = Memcg::new("prekill", "256M");
    let mut sleeper = cg
        .command(std::path::Path::new("/bin/sleep"))
        .arg("60")
        .spawn()
        .unwrap();
    let dir = std::env::temp_dir().join(format!("memtrace-prekill-{}", std::process::id()));
    let group = format!("/{}", cg.name);
    let mut t = Tracer::start(&[
        "memcg",
        "--cgroup",
        &group,
        "--prekill",
        "--prekill-dir",
        dir.to_str().unwrap(),
        "-d",
        "30",
        "--json",
    ]);
    assert!(
        t.early_stderr
            .contains("answering systemd-oomd's prekill calls"),
        "{}",
        t.early_stderr
    );
    let socket = dir.join(format!("memtrace-{}", t.pid()));
    let r = varlink_call(
        &socket,
        serde_json::json!({"method": "io.systemd.oom.Prekill.Notify", "parameters": {"cgroup": group}}),
    );
    assert_eq!(r, serde_json::json!({"parameters": {}}));
    // The description came before the reply.
    let line = t
        .stdout_line(
            |l| l.contains("\"memcg_warn\"") && l.contains("prekill"),
            Duration::from_secs(1),
        )
        .expect("no description of the group before the reply");
    assert!(line.contains(&format!("\"cgroup\":\"{group}\"")), "{line}");
    let r = varlink_call(
        &socket,
        serde_json::json!({"method": "org.example.Nothing"}),
    );
    assert_eq!(r["error"], "org.varlink.service.MethodNotFound", "{r}");
    t.signal(libc::SIGINT);
    let out = t.wait(Duration::from_secs(30));
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_eq!(out.code, 0, "{}", out.stderr);
    let summary = json_of(&out.stdout, "summary").pop().unwrap();
    assert_eq!(summary["prekill_calls"], 1, "{summary}");
    assert!(!socket.exists(), "the socket is left behind");
    let _ = std::fs::remove_dir(&dir);
}

/// `--prekill --heap`: oomd's call is answered after the group's processes
/// are described with what they hold, by stack: 24 MiB from malloc in
/// `grow_heap_mib` (an estimate from samples).
#[test]
fn prekill_answer_carries_the_held_heap_by_stack() {
    if !memcg_here("prekill_answer_carries_the_held_heap_by_stack") {
        return;
    }
    let cg = Memcg::new("prekillheap", "256M");
    let dir = std::env::temp_dir().join(format!("memtrace-prekillheap-{}", std::process::id()));
    let group = format!("/{}", cg.name);
    let t = Tracer::start(&[
        "memcg",
        "--cgroup",
        &group,
        "--prekill",
        "--prekill-dir",
        dir.to_str().unwrap(),
        "--heap",
        "--json",
    ]);
    let mut w = cg
        .command(&workload_bin())
        .args(["heap-steps", "1", "24", "5", "30000"])
        // Counted from the shim: allocate once it is in.
        .env("MEMTRACE_WAIT_SHIM_MS", "10000")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = w.id();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(w.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "held");
    let socket = dir.join(format!("memtrace-{}", t.pid()));
    let r = varlink_call(
        &socket,
        serde_json::json!({"method": "io.systemd.oom.Prekill.Notify", "parameters": {"cgroup": group}}),
    );
    assert_eq!(r, serde_json::json!({"parameters": {}}));
    t.signal(libc::SIGINT);
    let out = t.wait(Duration::from_secs(30));
    let _ = w.kill();
    let _ = w.wait();
    let _ = std::fs::remove_dir(&dir);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let heap = json_of(&out.stdout, "memcg_warn_heap");
    let held: u64 = heap
        .iter()
        .filter(|r| r["pid"] == pid)
        .filter(|r| user_frames(r).iter().any(|f| f.contains("grow_heap_mib")))
        .map(|r| r["bytes"].as_u64().unwrap())
        .sum();
    let mib = held as f64 / (1 << 20) as f64;
    assert!((15.0..=35.0).contains(&mib), "{mib} MiB: {heap:?}");
}
