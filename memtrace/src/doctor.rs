//! `memtrace doctor`: what this kernel offers, and how each tool attaches here.

use std::path::Path;

use crate::attach::Probe;
use crate::error::Result;
use crate::output::{Col, Printer, Row, TextPrinter, Value};
use crate::session::{Loader, Session};

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
    // SAFETY: no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    add(
        "root",
        yes(
            root,
            if root {
                ""
            } else {
                "run as root to load programs"
            },
        ),
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

    let mut tool_rows = Vec::new();
    if root {
        match Session::load(&Loader::default(), None, false) {
            Ok(mut s) => {
                add("bpf + ring buffer", yes(true, "object loaded"));
                let probes = [
                    (
                        "fentry",
                        Probe::new("fentry").fentry("oom_fentry", "oom_kill_process"),
                    ),
                    (
                        "tp_btf",
                        Probe::new("tp_btf").tp_btf("oom_tp_btf", "oom", "mark_victim"),
                    ),
                    (
                        "raw_tp",
                        Probe::new("raw_tp").raw_tp(
                            "faults_user_raw",
                            "exceptions",
                            "page_fault_user",
                        ),
                    ),
                ];
                for (name, p) in probes {
                    match s.first_way(&p) {
                        Ok(_) => add(name, yes(true, "loads and attaches")),
                        Err(e) => add(name, yes(false, e)),
                    }
                }
                drop(s);
                for (tool, probes) in crate::tools::all_probes() {
                    let Ok(mut s) = Session::load(&Loader::default(), None, false) else {
                        continue;
                    };
                    for p in probes {
                        let (method, detail) = match s.first_way(&p) {
                            Ok(w) => (w.method.name().to_string(), w.target.to_string()),
                            Err(e) => ("-".to_string(), e),
                        };
                        tool_rows.push(Row(vec![
                            Value::S(tool.into()),
                            Value::S(p.what.into()),
                            Value::S(method),
                            Value::S(detail),
                        ]));
                    }
                }
            }
            Err(e) => add("bpf + ring buffer", yes(false, e.to_string())),
        }
    }
    out.table("feature", "", &cols, &rows);
    if !tool_rows.is_empty() {
        let tcols = [
            Col::text("tool", "TOOL", 9),
            Col::text("probe", "PROBE", 22),
            Col::text("method", "METHOD", 10),
            Col::text("detail", "TARGET OR WHY NOT", 10),
        ];
        println!();
        out.table("tools", "", &tcols, &tool_rows);
    }
    Ok(0)
}
