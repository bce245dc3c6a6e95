//! Each tool's checks in the guest, against what its workload did: the same
//! exact figures the host tests assert, where the guest can know them.

use serde_json::Value;

use super::check::{json, of_type, Case, Guest};

/// What the workload printed (`MT-WORK`), split into words, for lines that
/// start with `tag`.
pub(super) fn report<'a>(g: &'a Guest, case: &str, tag: &str) -> Vec<Vec<&'a str>> {
    g.work
        .get(case)
        .into_iter()
        .flatten()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.first() == Some(&tag))
        .collect()
}

/// `swapped K of N` from the swap workload: K, the pages it must read back.
fn swapped(g: &Guest, case: &str) -> Option<u64> {
    report(g, case, "swapped").first()?.get(1)?.parse().ok()
}

/// The case said the kernel program could not unwind (it copies instead).
fn refused(g: &Guest, case: &Case) -> bool {
    g.err
        .get(case.name)
        .into_iter()
        .flatten()
        .any(|l| l.starts_with("memtrace: in-kernel unwinding could not be set up"))
}

fn sum(rows: &[&Value], field: &str) -> u64 {
    rows.iter().map(|r| r[field].as_u64().unwrap_or(0)).sum()
}

pub(super) fn check(g: &Guest, case: &Case, v: &[Value], why: &mut Vec<String>) {
    let st = &g.cases[case.name];
    let wpid = st.get("wpid").copied().unwrap_or(0);
    let wrc = st.get("wrc").copied();
    match case.tool {
        "oomkill" => oomkill(g, case, v, wpid, why),
        "memcg" => super::memcg::check(g, case, v, wpid, why),
        "drsnoop" => {
            // The kernel reclaims in the memcg before it kills: stalls of the
            // workload, memcg kind, in its cgroup.
            let stalls: Vec<_> = of_type(v, "reclaim_stall")
                .into_iter()
                .filter(|s| s["pid"] == wpid)
                .collect();
            if stalls.is_empty() {
                why.push(format!("no reclaim stall of {wpid}"));
            }
            if !stalls
                .iter()
                .all(|s| s["kind"] == "memcg" && s["memcg"] == "/mt-drsnoop")
            {
                why.push(format!("stalls not in /mt-drsnoop: {stalls:?}"));
            }
        }
        "faults" if case.name == "faults" => {
            // 2000 pages, plus at most the workload's own faults (measured by
            // faults-base) and 2 more, as the host test allows.
            let user = |c: &str| {
                let v = json(g.out.get(c).map_or(&[][..], |v| v));
                sum(&of_type(&v, "faults"), "user")
            };
            let (got, base) = (user("faults"), user("faults-base"));
            if got < 2000 || got > 2000 + base + 2 {
                why.push(format!(
                    "{got} user faults, expected 2000 + at most {base} + 2"
                ));
            }
        }
        "faults" if case.name == "faults-dwarf" => {
            // Unwound in the kernel: the loop's faults through its function
            // to main, the stacks complete (no stop mark), all 2000.
            let touch: Vec<_> = of_type(v, "fault_stack")
                .into_iter()
                .filter(|s| {
                    let f = s["user_stack"].as_array().cloned().unwrap_or_default();
                    let has = |n: &str| f.iter().any(|x| x.as_str().is_some_and(|x| x.contains(n)));
                    // A stop mark is a frame of its own: "[...]".
                    let mark = f
                        .iter()
                        .any(|x| x.as_str().is_some_and(|x| x.starts_with('[')));
                    has("touch_fresh_pages") && has("main") && !mark
                })
                .collect();
            let n = sum(&touch, "count");
            if n < 2000 {
                why.push(format!(
                    "{n} complete dwarf stacks through touch_fresh_pages, expected 2000"
                ));
            }
            // arm64: the unwinder program walks x86-64's registers only;
            // refused, said, and the copies unwound by memtrace.
            let want = if g.arm64() && refused(g, case) {
                "copy"
            } else {
                "kernel"
            };
            let summary = of_type(v, "summary");
            if summary.first().is_none_or(|s| s["unwinder"] != want) {
                why.push(format!("not unwound by {want}: {summary:?}"));
            }
        }
        "brkstack" => {
            // The loop's calls of a page and the brk(0) before it: two call
            // sites of one function, one stack when frames are by function.
            let calls: u64 = match case.name {
                "record-a" => 40,
                "record-b" => 60,
                _ => 50,
            };
            let (count, bytes) = (calls + 1, calls * 4096);
            let hit = of_type(v, "brk_stack").iter().any(|s| {
                s["count"] == count
                    && s["bytes"] == bytes
                    && s["user_stack"][0]
                        .as_str()
                        .is_some_and(|f| f.contains("grow_heap_with_raw_brk"))
            });
            if !hit {
                why.push(format!(
                    "no brk stack of grow_heap_with_raw_brk with count {count} and {bytes} bytes"
                ));
            }
            // In the kernel by default; where the unwinder program is
            // refused (arm64, whose registers it does not walk), copied
            // instead, and said so; without bpf_loop (5.10), the kernel's
            // walker, and said so.
            let kernel = of_type(v, "summary")
                .first()
                .is_some_and(|s| s["unwinder"] == "kernel");
            let said =
                refused(g, case)
                    || g.err.get(case.name).into_iter().flatten().any(|l| {
                        l.contains("fp by the kernel's walker (this kernel has no bpf_loop")
                    });
            if !kernel && !said {
                why.push("neither unwound in the kernel nor said why not".into());
            }
        }
        "top" => super::live::top(g, case, wpid, why),
        "serve" => super::live::serve(g, case, wpid, why),
        "report" => super::replay::report(g, v, why),
        "diff" => super::replay::diff(v, why),
        "ffaults" => {
            // 300 distinct pages of a ramfs file, read with no fault-around.
            let rows: Vec<_> = of_type(v, "file_faults")
                .into_iter()
                .filter(|r| r["file"] == "/mnt/ram/ffaults")
                .collect();
            let n = sum(&rows, "faults");
            if n != 300 {
                why.push(format!(
                    "{n} faults of /mnt/ram/ffaults, expected 300: {rows:?}"
                ));
            }
        }
        "rss" => {
            // Steps of 16 MiB: the 40 MiB threshold is crossed in the third.
            let ev = of_type(v, "rss_threshold");
            if ev.len() != 1 {
                why.push(format!("{} threshold events, expected 1", ev.len()));
            }
            if let Some(e) = ev.first() {
                let kb = e["rss_kb"].as_u64().unwrap_or(0);
                if kb <= 40 << 10 || kb >= 56 << 10 {
                    why.push(format!("threshold crossed at {kb} kB"));
                }
            }
            let in_alloc = of_type(v, "rss_threshold_stack").iter().any(|s| {
                s["user_stack"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|f| f.as_str().unwrap_or("").contains("allocate_and_touch_mib"))
            });
            if !in_alloc {
                why.push("no threshold stack through allocate_and_touch_mib".into());
            }
        }
        "mmapsnoop" => super::snoop::mmapsnoop(g, v, why),
        "shmsnoop" => super::snoop::shmsnoop(g, v, why),
        "swapin" => {
            // Exactly the pages that were in swap, not in the swap cache,
            // when the workload read them back.
            let got = sum(
                &of_type(v, "swapin")
                    .into_iter()
                    .filter(|r| r["pid"] == wpid)
                    .collect::<Vec<_>>(),
                "swapins",
            );
            match swapped(g, case.name) {
                Some(k) if k > 0 && got == k => {}
                Some(k) => why.push(format!("{got} swap-ins of {wpid}, expected {k}")),
                None => why.push("the workload did not say what it swapped".into()),
            }
        }
        "count" => {
            // 30 madvise calls, apart from the munmap calls.
            let rows = of_type(v, "count");
            let of = |tp: &str| rows.iter().find(|r| r["tracepoint"] == tp).copied();
            let ok = of("syscalls:sys_enter_madvise").is_some_and(|r| r["count"] == 30);
            if !ok {
                why.push("no madvise row with 30 calls".into());
            }
            if of("syscalls:sys_enter_munmap").is_none() {
                why.push("no munmap row".into());
            }
        }
        "trace" => {
            let lines = of_type(v, "trace");
            if lines.len() != 20 || lines.iter().any(|l| l["len_in"] != 8192) {
                why.push(format!(
                    "{} trace lines, expected 20 of len_in 8192",
                    lines.len()
                ));
            }
        }
        "memleak" => {
            // (allocations, bytes) held from each leaking function; nothing
            // from the one that frees all it makes.
            let held = |f: &str| -> (u64, u64) {
                of_type(v, "memleak")
                    .iter()
                    .filter(|r| r["user_stack"][0].as_str().is_some_and(|s| s.contains(f)))
                    .fold((0, 0), |(n, b), r| {
                        (
                            n + r["count"].as_u64().unwrap_or(0),
                            b + r["bytes"].as_u64().unwrap_or(0),
                        )
                    })
            };
            // One summary a run: a repeated case's rows add up over its runs.
            let runs = of_type(v, "summary").len() as u64;
            let want_runs = if case.name == "memleak-repeat" { 20 } else { 1 };
            if runs != want_runs {
                why.push(format!("{runs} runs, expected {want_runs}"));
            }
            for (f, (n, b)) in [
                ("leak_small_blocks", (7, 7000)),
                ("leak_big_blocks", (3, 3 << 20)),
                ("churn", (0, 0)),
            ] {
                let want = (n * runs, b * runs);
                let got = held(f);
                if got != want {
                    why.push(format!("{f}: {got:?} held, expected {want:?}"));
                }
            }
        }
        "compactsnoop" => {
            // One write to compact_memory: one run per populated zone, each
            // zone once, all the writing shell's, synchronous.
            let runs = of_type(v, "compaction");
            let mut zones: Vec<&str> = runs.iter().filter_map(|r| r["zone"].as_str()).collect();
            zones.sort();
            zones.dedup();
            if runs.is_empty() || zones.len() != runs.len() {
                why.push(format!(
                    "{} runs on {} zones, expected one a zone",
                    runs.len(),
                    zones.len()
                ));
            }
            if runs
                .iter()
                .any(|r| r["comm"] != "sh" || r["mode"] != "sync")
            {
                why.push("runs not the writing shell's or not sync".into());
            }
        }
        "vmscan" => {
            let pages = sum(&of_type(v, "vmscan"), "memcg_pages");
            if pages == 0 {
                why.push("no memcg reclaim pages".into());
            }
            let stalled = of_type(v, "vmscan_process")
                .iter()
                .any(|p| p["pid"] == wpid && p["kind"] == "memcg");
            if !stalled {
                why.push(format!("no memcg row of {wpid}"));
            }
            if swapped(g, case.name).unwrap_or(0) == 0 {
                why.push("the workload had nothing swapped out".into());
            }
        }
        _ => {}
    }
    let want_wrc = match case.tool {
        // SIGKILLed by the OOM killer (128 + 9).
        "memcg" if case.name == "warn-fail" => 0,
        "oomkill" | "drsnoop" | "memcg" => 137,
        _ => 0,
    };
    if wrc.is_some_and(|w| w != want_wrc) {
        why.push(format!(
            "the workload exited with {wrc:?}, expected {want_wrc}"
        ));
    }
}

fn oomkill(g: &Guest, case: &Case, v: &[Value], wpid: i64, why: &mut Vec<String>) {
    let want = case.method.unwrap_or("-");
    let kills: Vec<_> = of_type(v, "oom_kill")
        .into_iter()
        .filter(|k| k["victim_pid"] == wpid)
        .collect();
    if kills.len() != 1 {
        why.push(format!("{} kills of {wpid} reported", kills.len()));
    }
    let Some(k) = kills.first() else { return };
    let mut expect = |field: &str, want: Value| {
        if k[field] != want {
            why.push(format!("{field} {} != {want}", k[field]));
        }
    };
    expect("victim_comm", "memtrace-worklo".into());
    expect("memcg", format!("/mt-{}", case.name).into());
    // A 64 MiB limit in 4 KiB pages, from oom_control where the method sees
    // it (kprobe, fentry), else from the memcg limit.
    expect("pages", 16384.into());
    let source = if matches!(want, "kprobe" | "fentry") {
        "oom_control"
    } else {
        "memcg_limit"
    };
    expect("pages_source", source.into());
    expect("method", want.into());
    if k["anon_rss_kb"].as_u64().unwrap_or(0) <= 32 * 1024 {
        why.push(format!("anon_rss_kb {} too small", k["anon_rss_kb"]));
    }
    if matches!(case.name, "oom-best" | "oom-tracepoint") {
        let late_ok = case.name == "oom-tracepoint";
        victim_stack(k, v, (wpid, g.arm64()), late_ok, why);
    }
}

/// `--stack`: the workload triggered its own kill, allocating in
/// `allocate_and_touch_mib`, so the stack shown is its own: the kernel part
/// through the OOM killer, the user part through that function (its maps
/// read while it failed reclaim, before the kill).
/// The classic tracepoint fires after the kill is sent: under emulation the
/// victim can be gone before its maps are read even with the read in
/// reclaim, and the report must then say so (`late_ok`).
fn victim_stack(
    k: &Value,
    v: &[Value],
    (wpid, arm64): (i64, bool),
    late_ok: bool,
    why: &mut Vec<String>,
) {
    if k["stack_of"] != "victim" {
        why.push(format!("stack_of {}, expected victim", k["stack_of"]));
    }
    let frames = |s: &Value, key: &str| -> Vec<String> {
        s[key]
            .as_array()
            .into_iter()
            .flatten()
            .map(|f| f.as_str().unwrap_or("").to_string())
            .collect()
    };
    let stacks = of_type(v, "oom_stack");
    let Some(s) = stacks.iter().find(|s| s["pid"] == wpid) else {
        why.push(format!("no oom_stack of {wpid}"));
        return;
    };
    // arm64's walker starts at the frame record of the probed function's
    // caller (a probe at an entry sees its return address only in the link
    // register): the memcg OOM path's caller of out_of_memory stands for it.
    if !frames(s, "kernel_stack").iter().any(|f| {
        f.starts_with("out_of_memory") || (arm64 && f.starts_with("mem_cgroup_out_of_memory"))
    }) {
        why.push("kernel stack not through out_of_memory".into());
    }
    let user = frames(s, "user_stack");
    let said_late = late_ok
        && user
            .iter()
            .any(|f| f.contains("exited before its maps were read"));
    if !user.iter().any(|f| f.contains("allocate_and_touch_mib")) && !said_late {
        why.push(format!("user stack {user:?}"));
    }
}
