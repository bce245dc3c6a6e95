//! serve facing its network: slow, idle and too many clients, its dropped
//! capabilities, control bytes in labels escaped.

use super::*;

/// A client sending a byte a second, and a hundred idle connections, never
/// hold up a scrape: each connection has its own thread and a deadline for
/// its whole request (one byte a second kept /metrics from answering at
/// all when connections were served one at a time with a timeout per read).
#[test]
fn slow_and_idle_clients_do_not_hold_up_a_scrape() {
    let port = free_port();
    let t = serve(port, &[]);
    settle(port, |m| m.contains("memtrace_"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickle = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
            for b in b"GET /metrics HTTP/1.1\r\n".iter().cycle() {
                if stop.load(std::sync::atomic::Ordering::Relaxed) || c.write_all(&[*b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        })
    };
    let idle: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    // With both holding their connections, a scrape is answered at once.
    for _ in 0..3 {
        let t0 = Instant::now();
        scrape(port);
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    }
    // The idle ones are let go at their deadline (5 s for the request).
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t0 = Instant::now();
    let mut s = String::new();
    let _ = c.read_to_string(&mut s);
    assert!(t0.elapsed() < Duration::from_secs(7), "{:?}", t0.elapsed());
    drop(idle);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = trickle.join();
    t.interrupt();
}

/// Open connections are bounded: past 256 held open, the next is answered
/// 503 at once (not queued behind them), and a scrape is served again as
/// soon as they are let go.
#[test]
fn connections_past_the_bound_are_answered_503_at_once() {
    let port = free_port();
    let t = serve(port, &[]);
    settle(port, |m| m.contains("memtrace_"));
    let held: Vec<TcpStream> = (0..256)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let t0 = Instant::now();
    let mut s = String::new();
    let _ = c.read_to_string(&mut s);
    assert!(s.starts_with("HTTP/1.1 503"), "{s:?}");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    drop(held);
    std::thread::sleep(Duration::from_millis(300));
    assert!(scrape(port).contains("memtrace_"));
    t.interrupt();
}

/// Once attached, serve holds no capability (effective, permitted or
/// bounding) and no_new_privs is set: it reads what network clients send.
/// A process name with an ESC in it is a label with the byte written out,
/// never sent raw to whatever shows the page.
#[test]
fn serve_becomes_nobody_without_capabilities_and_writes_out_control_bytes() {
    let port = free_port();
    let t = serve(port, &["--max-series", "10000"]);
    let _ = settle(port, |m| m.contains("memtrace_page_faults_total{"));
    let status = std::fs::read_to_string(format!("/proc/{}/status", t.pid())).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("{name} missing: {status}"))
            .trim()
            .to_string()
    };
    for cap in ["CapEff:", "CapPrm:", "CapBnd:", "CapAmb:"] {
        assert_eq!(field(cap), "0000000000000000", "{cap}\n{status}");
    }
    assert_eq!(field("NoNewPrivs:"), "1", "{status}");
    // Not root any more: a capability-less uid 0 still owns root's files.
    let uids: Vec<&str> = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(uids, ["65534"; 4], "{status}");
    assert_eq!(field("Groups:"), "", "{status}");
    // Its threads too (the HTTP ones start after the drop).
    for task in std::fs::read_dir(format!("/proc/{}/task", t.pid())).unwrap() {
        let st = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap_or_default();
        let eff = st.lines().find_map(|l| l.strip_prefix("CapEff:"));
        assert!(eff.is_none_or(|e| e.trim() == "0000000000000000"), "{st}");
    }
    let dir = std::env::temp_dir().join(format!("memtrace-esc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let named = dir.join("mt\u{1b}esc");
    std::fs::copy(workload_bin(), &named).unwrap();
    let st = Command::new(&named)
        .args(["touch", "300"])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let text = settle(port, |m| m.contains("mt\\\\x1besc"));
    assert!(!text.contains('\u{1b}'), "a raw ESC in the page");
    let out = t.interrupt();
    assert_eq!(out.code, 0, "{}", out.stderr);
    let _ = std::fs::remove_dir_all(dir);
}
