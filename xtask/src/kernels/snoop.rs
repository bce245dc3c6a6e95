//! mmapsnoop and shmsnoop in the guest: every call the workload reported
//! (`memtrace-workload maps FILE`, `shm`) matched to exactly one event with
//! its arguments and result, as tests/snoop.rs does on the host.

use serde_json::Value;

use super::check::{of_type, Guest};
use super::tools::report;

const PAGE: u64 = 4096;

/// The one event matching `f`, or why not.
fn one<'a>(ev: &[&'a Value], what: &str, f: impl Fn(&Value) -> bool) -> Result<&'a Value, String> {
    let hits: Vec<&Value> = ev.iter().copied().filter(|e| f(e)).collect();
    match hits[..] {
        [e] => Ok(e),
        _ => Err(format!("{what}: {} events match", hits.len())),
    }
}

/// `e[field] == want`, or a line saying what differs.
fn field(e: &Value, name: &str, want: Value, why: &mut Vec<String>) {
    if e[name] != want {
        why.push(format!("{} {name} {} != {want}", e["op"], e[name]));
    }
}

pub(super) fn mmapsnoop(g: &Guest, v: &[Value], why: &mut Vec<String>) {
    if let Err(e) = mmap_calls(g, v, why) {
        why.push(e);
    }
}

fn mmap_calls(g: &Guest, v: &[Value], why: &mut Vec<String>) -> Result<(), String> {
    let all = of_type(v, "mmap_call");
    let mapped = report(g, "mmapsnoop", "mmap");
    // The workload's regions: pages, prot, flags (its MAP_REGIONS).
    let expected = [
        (1, "R--", "PRIVATE|ANONYMOUS"),
        (2, "RW-", "PRIVATE|ANONYMOUS"),
        (3, "---", "PRIVATE|ANONYMOUS"),
        (5, "R-X", "PRIVATE|ANONYMOUS|NORESERVE"),
    ];
    if mapped.len() != expected.len() {
        return Err(format!("the workload reported {} mmaps", mapped.len()));
    }
    // Under -c the loader's and libc's start-up calls come first: look from
    // the workload's first region on (a start-up munmap may share an address).
    let first = all
        .iter()
        .position(|e| e["op"] == "mmap" && e["result"] == mapped[0][1])
        .ok_or("the first region's mmap is missing")?;
    let ev = &all[first..];
    for (m, (pages, prot, flags)) in mapped.iter().zip(expected) {
        let e = one(ev, "mmap of a region", |e| {
            e["op"] == "mmap" && e["result"] == m[1]
        })?;
        field(e, "len", (pages * PAGE).into(), why);
        field(e, "prot", prot.into(), why);
        field(e, "flags", flags.into(), why);
        field(e, "addr", "0x0".into(), why);
        field(e, "fd", (-1).into(), why);
        field(e, "file", Value::Null, why);
    }
    // mremap of region 1 from 2 to 7 pages.
    let r = report(g, "mmapsnoop", "mremap");
    let r = r.first().ok_or("no mremap reported")?;
    let e = one(ev, "mremap", |e| e["op"] == "mremap")?;
    field(e, "addr", r[1].into(), why);
    field(e, "len", (2 * PAGE).into(), why);
    field(e, "new_len", (7 * PAGE).into(), why);
    field(e, "flags", "MAYMOVE".into(), why);
    field(e, "result", r[2].into(), why);
    // The ramfs file, mapped shared and read-only, named.
    let f = report(g, "mmapsnoop", "file");
    let f = f.first().ok_or("no file mmap reported")?;
    let e = one(ev, "file mmap", |e| {
        e["op"] == "mmap" && e["result"] == f[1]
    })?;
    field(e, "len", (3 * PAGE).into(), why);
    field(e, "prot", "R--".into(), why);
    field(e, "flags", "SHARED".into(), why);
    field(e, "fd", f[3].parse::<i64>().unwrap_or(-2).into(), why);
    field(e, "file", "/mnt/ram/mmapsnoop".into(), why);
    let unmapped = report(g, "mmapsnoop", "munmap");
    if unmapped.len() != 5 {
        return Err(format!("the workload reported {} munmaps", unmapped.len()));
    }
    for u in &unmapped {
        let e = one(ev, "munmap", |e| e["op"] == "munmap" && e["addr"] == u[1])?;
        field(e, "len", u[2].parse::<u64>().unwrap_or(0).into(), why);
        field(e, "result", "0".into(), why);
    }
    // The two failed mmaps, by errno name.
    let e = one(ev, "mmap of length 0", |e| e["result"] == "EINVAL")?;
    field(e, "len", 0.into(), why);
    field(e, "prot", "R--".into(), why);
    let e = one(ev, "mmap of 2^48 bytes", |e| e["result"] == "ENOMEM")?;
    field(e, "len", (1u64 << 48).into(), why);
    field(e, "prot", "RW-".into(), why);
    Ok(())
}

pub(super) fn shmsnoop(g: &Guest, v: &[Value], why: &mut Vec<String>) {
    let ev = of_type(v, "shm_call");
    let (Some(id), Some(addr)) = (
        report(g, "shmsnoop", "shmid").first().map(|l| l[1]),
        report(g, "shmsnoop", "shmat").first().map(|l| l[1]),
    ) else {
        why.push("the workload reported no shmid or shmat".into());
        return;
    };
    let calls: Vec<&str> = ev
        .iter()
        .map(|e| e["syscall"].as_str().unwrap_or("?"))
        .collect();
    if calls != ["shmget", "shmat", "shmdt", "shmctl"] {
        why.push(format!("calls {calls:?}"));
        return;
    }
    // 16 pages, IPC_CREAT|0600, as the workload asks.
    let want = [
        (
            "key=IPC_PRIVATE size=65536 shmflg=IPC_CREAT|0600".to_string(),
            id,
        ),
        (format!("shmid={id} shmaddr=0x0 shmflg=0"), addr),
        (format!("shmaddr={addr}"), "0"),
        (format!("shmid={id} cmd=IPC_RMID buf=0x0"), "0"),
    ];
    for (e, (args, result)) in ev.iter().zip(want) {
        if e["args"] != args.as_str() || e["result"] != result {
            why.push(format!("{e} != {args} -> {result}"));
        }
    }
}
