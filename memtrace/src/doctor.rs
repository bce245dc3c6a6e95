//! `memtrace doctor`: what this kernel offers, and how each tool attaches here.

use std::path::Path;

use crate::error::Result;
use crate::output::{Col, Printer, Row, TextPrinter, Value};
use crate::session::attach::Probe;
use clap::Parser;

use crate::kernel::KernelBtf;
use crate::session::{Loader, Session};
use memtrace_common::names;

/// A tool's command line as doctor gives it, parsed as the tool's own.
#[derive(Parser)]
struct OneTool {
    #[command(subcommand)]
    tool: crate::tools::ToolCommand,
}

fn yes(ok: bool, detail: impl Into<String>) -> Row {
    Row(vec![
        Value::S(if ok { "yes" } else { "no" }.into()),
        Value::S(detail.into()),
    ])
}

pub fn doctor() -> Result<i32> {
    let mut out = TextPrinter::new(Box::new(std::io::stdout()), false);
    let cols = [
        Col::text("feature", "FEATURE", 22),
        Col::text("ok", "OK", 4),
        Col::text("detail", "DETAIL", 10),
    ];
    let mut rows: Vec<Row> = Vec::new();
    let mut add = |name: &str, r: Row| {
        let mut v = vec![Value::S(name.into())];
        v.extend(r.0);
        rows.push(Row(v));
    };
    let uname = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    add("kernel", yes(true, uname.trim()));
    let caps = crate::kernel::caps::check();
    let privileged = caps.is_ok();
    add(
        "privileges",
        match caps {
            Ok(()) => yes(true, ""),
            Err(e) => yes(false, e.to_string()),
        },
    );
    match crate::kernel::tracefs::root() {
        Ok(p) => add("tracefs", yes(true, p.display().to_string())),
        Err(e) => add("tracefs", yes(false, e.to_string())),
    }
    let btf = Path::new(crate::kernel::btf::VMLINUX).exists();
    add("btf", yes(btf, crate::kernel::btf::VMLINUX));
    let kprobe = Path::new("/sys/bus/event_source/devices/kprobe/type").exists();
    add(
        "kprobe pmu",
        yes(kprobe, if kprobe { "" } else { "CONFIG_KPROBES is off" }),
    );
    let v1 = Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists();
    let v2 = [
        "/sys/fs/cgroup/cgroup.controllers",
        "/sys/fs/cgroup/unified/cgroup.controllers",
    ]
    .iter()
    .any(|p| Path::new(p).exists());
    add(
        "memory cgroup",
        yes(
            v1 || v2,
            format!(
                "v1: {}, v2: {}",
                if v1 { "yes" } else { "no" },
                if v2 { "yes" } else { "no" }
            ),
        ),
    );
    add("oomd prekill hook", prekill_row());

    let mut tool_rows = Vec::new();
    if privileged {
        // The feature programs read through the task offsets as the tools do.
        let mut loader = Loader::default();
        if let Ok(t) = KernelBtf::shared().and_then(|b| b.task_offsets()) {
            loader.global(names::TASK, &t);
        }
        match Session::load(&loader, None, false) {
            Ok(mut s) => {
                let which = match crate::session::compat() {
                    true => {
                        "the compat object loaded (no bpf_loop: user stacks by the kernel's walker)"
                    }
                    false => "object loaded",
                };
                add("bpf + ring buffer", yes(true, which));
                let probes = [
                    (
                        "fentry",
                        Probe::new("fentry").fentry(names::OOM_FENTRY, "oom_kill_process"),
                    ),
                    (
                        "tp_btf",
                        Probe::new("tp_btf").tp_btf(names::OOM_TP_BTF, "oom", "mark_victim"),
                    ),
                    (
                        "raw_tp",
                        Probe::new("raw_tp").raw_tp(
                            names::FAULTS_RAW,
                            "exceptions",
                            "page_fault_user",
                        ),
                    ),
                ];
                for (name, p) in probes {
                    match s.first_way(&p) {
                        Ok(_) => add(name, yes(true, "loads and attaches")),
                        Err(e) => add(name, yes(false, e.to_string())),
                    }
                }
                drop(s);
                for tool in ["faults", "brkstack"] {
                    add(&format!("kernel unwind {tool}"), unwind_row(tool));
                }
                for tool in crate::tools::NAMES {
                    tool_rows.extend(tool_attach_rows(tool));
                }
            }
            Err(e) => add("bpf + ring buffer", yes(false, e.to_string())),
        }
    }
    out.table("feature", "", &cols, &rows);
    if !tool_rows.is_empty() {
        // As wide as the longest tool's name: rows are read by column.
        let wide = crate::tools::NAMES.iter().map(|n| n.len()).max();
        let tcols = [
            Col::text("tool", "TOOL", wide.unwrap_or(9)),
            Col::text("probe", "PROBE", 22),
            Col::text("method", "METHOD", 10),
            Col::text("detail", "TARGET OR WHY NOT", 10),
        ];
        out.blank_line();
        out.table("tools", "", &tcols, &tool_rows);
    }
    out.flush();
    crate::output::check(&out)?;
    Ok(0)
}

/// Whether systemd-oomd here calls prekill hooks (systemd 260 brought
/// them), for `memcg --prekill`.
fn prekill_row() -> Row {
    let version = std::process::Command::new("systemctl")
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            let v = text.split_whitespace().nth(1)?.to_string();
            v.parse::<u32>().ok()
        });
    let running = crate::process::proc::pids().into_iter().any(|p| {
        std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "systemd-oomd")
    });
    match (version, running) {
        (None, _) => yes(false, "no systemd here: no oomd to call memcg --prekill"),
        (Some(v), _) if v < 260 => yes(
            false,
            format!("systemd {v} here: oomd calls prekill hooks from 260 (memcg --prekill waits for calls that never come)"),
        ),
        (Some(v), false) => yes(false, format!("systemd {v}, but systemd-oomd is not running")),
        (Some(v), true) => yes(
            true,
            format!("systemd {v} with systemd-oomd: memcg --prekill answers it (PrekillHookTimeoutSec= in oomd.conf)"),
        ),
    }
}

/// Loads and attaches `tool` with its default arguments exactly as a run
/// does (same offsets, globals and map sizes: `run::attach`), then detaches:
/// one row per probe with the method that attached, or why none did.
fn tool_attach_rows(tool: &str) -> Vec<Row> {
    let row = |probe: &str, method: &str, detail: String| {
        Row(vec![
            Value::S(tool.into()),
            Value::S(probe.into()),
            Value::S(method.into()),
            Value::S(detail),
        ])
    };
    // Tools that need a process are given doctor's own; the generic
    // tracepoint tools the tracepoint brkstack uses.
    let me = std::process::id().to_string();
    let cmds: Vec<crate::tools::ToolCommand> = [
        // serve: any free port, never the one a running serve holds.
        vec!["memtrace", tool, "--listen", "127.0.0.1:0"],
        vec!["memtrace", tool],
        vec!["memtrace", tool, "-p", &me],
        vec!["memtrace", tool, "syscalls:sys_enter_brk"],
    ]
    .into_iter()
    .filter_map(|argv| OneTool::try_parse_from(argv).ok().map(|o| o.tool))
    .collect();
    let Some((mut t, common)) = crate::output::muted(|| cmds.iter().find_map(|c| c.build().ok()))
    else {
        return vec![row("-", "-", "needs arguments doctor cannot give".into())];
    };
    let target = common.pid;
    match crate::output::muted(|| crate::run::attach(t.as_mut(), common, target, false)) {
        Ok(s) => {
            let mut rows: Vec<Row> = s
                .attached
                .iter()
                .map(|(p, m, target)| row(p, m, target.clone()))
                .collect();
            for p in t.probes() {
                if !s.attached.iter().any(|(w, _, _)| *w == p.what) {
                    rows.push(row(&p.what, "-", "optional: not attached here".into()));
                }
            }
            rows
        }
        Err(e) => vec![row("-", "-", e.to_string())],
    }
}

/// Whether `tool`'s program unwinds DWARF stacks in this kernel (the
/// verifier has its say), and the unwind tables: their budget, and what
/// memtrace's own process takes (its binary, libc, ld.so), and how long
/// building that took.
fn unwind_row(tool: &str) -> Row {
    let me = std::process::id().to_string();
    let mut argv = vec!["memtrace", tool, "--stack-mode", "dwarf", "-p", &me];
    if tool == "faults" {
        argv.push("--stacks");
    }
    let cmd = match OneTool::try_parse_from(argv) {
        Ok(o) => o.tool,
        Err(_) => return yes(false, "arguments refused"),
    };
    let (mut t, common) = match cmd.build() {
        Ok(x) => x,
        Err(e) => return yes(false, e.to_string()),
    };
    let attached = crate::output::muted(|| {
        crate::run::attach_with(t.as_mut(), common, common.pid, false, false)
    });
    match attached {
        Ok(s) => {
            let mut maps = s.sym.maps.lock().unwrap();
            maps.snapshot(std::process::id());
            let Some(st) = maps.ktables.as_ref().map(|k| k.stats) else {
                return yes(false, "not set up");
            };
            let mib = |words: u64| crate::stacks::ktables::table_bytes(words) as f64 / 1048576.0;
            // How a process's first events, before its table, are unwound.
            let first = match crate::kernel::KernelBtf::shared().map(|b| b.vma_offsets()) {
                Ok(Ok(_)) => "by their files' tables (bpf_find_vma)".to_string(),
                Ok(Err(e)) => format!("by frame pointers ({e})"),
                Err(e) => format!("by frame pointers ({e})"),
            };
            yes(
                true,
                format!(
                    "tables: {:.0} MiB budget (--unwind-table-size); memtrace's own {} files \
                     take {:.1} MiB ({} rows naming {} distinct rules), built in {:.0} ms; {} \
                     files left out; a new process's first events unwound {first}",
                    mib(st.capacity_words),
                    st.files,
                    mib(st.words),
                    st.rows,
                    st.rules,
                    st.build_ms,
                    st.files_over_budget + st.files_no_info
                ),
            )
        }
        // The verifier's log is long: its first line names the program.
        Err(e) => {
            let e = e.to_string();
            let first = e.split(". Verifier output").next().unwrap_or(&e);
            yes(false, format!("{first}: stacks are copied instead"))
        }
    }
}
