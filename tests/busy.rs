//! `-p` on a busy host: a churn of other processes faulting, exec'ing and
//! exiting, and another memtrace tracing the whole host beside it. The
//! target's counts stay exact and its losses are its own: runs the kernel
//! skipped elsewhere on the host are not the target's (`host_missed_runs`,
//! shown apart), and nothing of the churn is counted.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// Two shells running `script` in a loop; stopped when dropped.
struct Churn(Vec<std::process::Child>);

impl Churn {
    fn start(script: &str) -> Churn {
        let loop_ = format!("while :; do {script}; done");
        Churn(
            (0..2)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", &loop_])
                        .stdout(Stdio::null())
                        .spawn()
                        .expect("spawn the churn")
                })
                .collect(),
        )
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        for b in self.0.iter_mut() {
            let _ = b.kill();
            let _ = b.wait();
        }
    }
}

#[test]
fn a_pid_run_on_a_busy_host_counts_exactly_and_loses_nothing_of_its_target() {
    const N: u64 = 5000;
    let w = workload_bin();
    // Two shells starting faulting processes one after another.
    let busy = Churn::start(&format!("{} touch 3000", w.display()));
    // And the whole host traced by stack at the same time.
    let host = Tracer::start(&["faults", "--stacks", "--json", "-d", "8"]);
    std::thread::sleep(Duration::from_millis(500));
    let base = trace_workload(&["touch", "0"], &[&["faults"]]).remove(0);
    let out = trace_workload(&["touch", &N.to_string()], &[&["faults"]]).remove(0);
    drop(busy);
    let host = host.wait(Duration::from_secs(30));
    assert_eq!(host.code, 0, "{}", host.stderr);
    let user = |s: &str| -> u64 {
        json_of(s, "faults")
            .iter()
            .map(|r| r["user"].as_u64().unwrap())
            .sum()
    };
    let (got, base) = (user(&out), user(&base));
    assert!(
        got >= N && got <= N + base + 2,
        "got {got}, expected {N} + baseline {base}: {out}"
    );
    let s = &json_of(&out, "summary")[0];
    assert_eq!(s["lost_total"], 0, "{s}");
    // Only the target's process is in the table.
    assert_eq!(json_of(&out, "faults").len(), 1, "{out}");
    // The host-wide run saw the churn.
    let churned: u64 = json_of(&host.stdout, "fault_stack")
        .iter()
        .filter(|r| r["comm"] == "memtrace-worklo")
        .map(|r| r["count"].as_u64().unwrap())
        .sum();
    assert!(churned > 3 * 3000, "{churned}");
}

/// Ctrl-C ends a host-wide `faults --stacks` on a churning host promptly,
/// with its report. The event loop never yielded while some branch was
/// always ready, so the runtime saw the signal only after the task's
/// cooperative budget: 10 to 45 s from Ctrl-C to exit, here; 1.1-1.9 s
/// since. The bound leaves room for a loaded CI host.
#[test]
fn ctrl_c_ends_a_host_wide_stack_run_on_a_churning_host_promptly() {
    let w = workload_bin();
    // Short processes with many stacks each (an interpreter's start).
    let busy = Churn::start(&format!(
        "{} touch 50; python3 -c 'x=[0]*100000' 2>/dev/null || true",
        w.display()
    ));
    let host = Tracer::start(&["faults", "--stacks", "--json"]);
    std::thread::sleep(Duration::from_secs(8));
    let asked = std::time::Instant::now();
    host.signal(libc::SIGINT);
    let out = host.wait(Duration::from_secs(60));
    let took = asked.elapsed();
    drop(busy);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        took < Duration::from_secs(6),
        "{took:?} from SIGINT to exit"
    );
    // With its report.
    assert!(!json_of(&out.stdout, "fault_stack").is_empty());
    assert_eq!(json_of(&out.stdout, "summary").len(), 1, "{}", out.stdout);
}
