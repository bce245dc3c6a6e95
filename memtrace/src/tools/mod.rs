//! One module per tool. Each declares its probes (with fallbacks), sets the
//! globals its kernel programs need, aggregates, and hands rows to a printer.

pub mod brkstack;
pub mod decode;
pub mod drsnoop;
pub mod faults;
pub mod ffaults;
pub mod mmapsnoop;
pub mod oomkill;
pub mod rss;
pub mod shmsnoop;
pub mod swapin;
pub mod vmscan;

use crate::cli::{Cli, Command};
use crate::error::Result;
use crate::run::{run, Tool};

pub fn dispatch(cli: Cli) -> Result<i32> {
    match cli.cmd {
        Command::Oomkill(a) => run_tool(oomkill::Oomkill::new(&a)?, &a.common),
        Command::Faults(a) => run_tool(faults::Faults::new(&a)?, &a.common),
        Command::Ffaults(a) => run_tool(ffaults::Ffaults::new(&a)?, &a.common),
        Command::Brkstack(a) => run_tool(brkstack::Brkstack::new(&a)?, &a.common),
        Command::Vmscan(a) => run_tool(vmscan::Vmscan::new(&a)?, &a.common),
        Command::Drsnoop(a) => run_tool(drsnoop::Drsnoop::new(&a)?, &a.common),
        Command::Swapin(a) => run_tool(swapin::Swapin::new(&a)?, &a.common),
        Command::Rss(a) => run_tool(rss::Rss::new(&a)?, &a.common),
        Command::Mmapsnoop(a) => run_tool(mmapsnoop::Mmapsnoop::new(&a)?, &a.common),
        Command::Shmsnoop(a) => run_tool(shmsnoop::Shmsnoop::new(&a)?, &a.common),
        Command::Doctor => crate::doctor::doctor(),
    }
}

fn run_tool<T: Tool>(mut t: T, common: &crate::cli::Common) -> Result<i32> {
    run(&mut t, common)
}

/// Every tool with default arguments, for `doctor`.
pub fn all_probes() -> Vec<(&'static str, Vec<crate::attach::Probe>)> {
    vec![
        ("oomkill", oomkill::probes()),
        ("faults", faults::probes()),
        ("ffaults", ffaults::probes()),
        ("brkstack", brkstack::probes()),
        ("vmscan", vmscan::probes()),
        ("drsnoop", drsnoop::probes()),
        ("swapin", swapin::probes()),
        ("rss", rss::probes()),
        ("mmapsnoop", mmapsnoop::probes()),
        ("shmsnoop", shmsnoop::probes()),
    ]
}

/// Follows execs, for `exec_names`; optional: without it, processes keep the
/// name of their first event.
pub fn exec_probe() -> crate::attach::Probe {
    crate::attach::Probe::new("process execs")
        .tracepoint("name_exec", "sched", "sched_process_exec")
        .optional()
}

/// Processes that exec'd during the trace, by the name they took (sized by
/// the tool as `EXEC_NAMES`).
pub fn exec_names(s: &crate::session::Session) -> std::collections::HashMap<u32, String> {
    let Some(m) = s.bpf.map("EXEC_NAMES") else {
        return Default::default();
    };
    let Ok(names) = aya::maps::HashMap::<_, u32, [u8; memtrace_common::TASK_COMM_LEN]>::try_from(m)
    else {
        return Default::default();
    };
    names
        .iter()
        .filter_map(|e| e.ok())
        .map(|(pid, c)| (pid, comm(&c)))
        .collect()
}

/// A C string from a fixed-size kernel buffer.
pub fn comm(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// The command name of per-CPU values: the first CPU's that has one.
pub fn first_comm<'a>(
    comms: impl IntoIterator<Item = &'a [u8; memtrace_common::TASK_COMM_LEN]>,
) -> String {
    comms
        .into_iter()
        .map(|c| comm(c))
        .find(|c| !c.is_empty())
        .unwrap_or_default()
}

/// Reads a `#[repr(C)]` record of `kind` (its first field, as in every
/// record) from ring-buffer bytes; None for other kinds or short data.
pub fn record<T: Copy>(data: &[u8], kind: u32) -> Option<T> {
    if data.len() < std::mem::size_of::<T>() || data[..4] != kind.to_ne_bytes() {
        return None;
    }
    // SAFETY: length checked; T is plain data written by the kernel program.
    Some(unsafe { std::ptr::read_unaligned(data.as_ptr() as *const T) })
}

/// Common interval arguments: `-i SECS` and a count.
#[derive(Debug, Clone, clap::Args)]
pub struct IntervalArgs {
    /// Print every this many seconds (e.g. 1, 500ms) instead of only at the end.
    #[arg(short = 'i', long = "interval", value_parser = crate::cli::parse_duration)]
    pub interval: Option<std::time::Duration>,
    /// Stop after this many intervals.
    #[arg(long = "count")]
    pub count: Option<u64>,
}

/// In dwarf mode, the unwound samples as stack reports, largest first,
/// scaled by the sampling rate (estimates when sampled); None in fp mode.
pub fn sampled_reports(
    s: &mut crate::session::Session,
    clear: bool,
    mode: u32,
    top: usize,
    with_value: bool,
) -> Option<Vec<crate::output::StackReport>> {
    use memtrace_common::stack_mode;
    let d = s.dwarf.as_mut()?;
    let every = d.every as u64;
    let mut v = d.take(clear);
    v.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(b.1.value.cmp(&a.1.value)));
    v.truncate(top);
    let reports = v
        .into_iter()
        .map(|(k, val)| {
            let user = s.sym.user(k.tgid, &k.user);
            let kernel = s.kernel_frames(k.kstack);
            let note = if mode & stack_mode::KERNEL != 0 && k.kstack < 0 {
                Some("kernel stack capture failed (counted in stack_fail)".to_string())
            } else {
                val.end.and_then(|e| e.note()).map(String::from)
            };
            crate::output::StackReport {
                pid: k.tgid,
                comm: val.comm,
                count: val.count * every,
                bytes: with_value.then_some(val.value * every),
                user,
                kernel,
                note,
            }
        })
        .collect();
    Some(reports)
}

/// A title note for sampled stacks, empty when every event was unwound.
pub fn sampled_title(s: &crate::session::Session) -> String {
    match &s.dwarf {
        Some(d) if d.every > 1 => format!("stacks sampled 1 in {}: counts are estimates", d.every),
        _ => String::new(),
    }
}

/// A stack-keyed count, symbolized, for any tool that counts by stack.
pub fn stack_report(
    s: &mut crate::session::Session,
    pid: u32,
    comm: String,
    ids: (i32, i32),
    mode: u32,
    count: u64,
    bytes: Option<u64>,
) -> crate::output::StackReport {
    use memtrace_common::stack_mode;
    let (ustack, kstack) = ids;
    let user = s.user_frames(pid, ustack);
    let kernel = s.kernel_frames(kstack);
    let wanted_user = mode & stack_mode::USER != 0;
    let wanted_kernel = mode & stack_mode::KERNEL != 0;
    // -1: capture failed (-2 is a copied stack, -3 one left out by --sample).
    let note = if (wanted_user && ustack == -1) || (wanted_kernel && kstack < 0) {
        Some("stack capture failed (counted in stack_fail)".to_string())
    } else if wanted_user && user.is_empty() && ustack >= 0 {
        Some("stack id no longer in the stack map".to_string())
    } else {
        None
    };
    crate::output::StackReport {
        pid,
        comm,
        count,
        bytes,
        user,
        kernel,
        note,
    }
}
