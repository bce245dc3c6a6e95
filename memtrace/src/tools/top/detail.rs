//! Enter on a process: its top page-fault and heap-growth (brk) stacks.
//! The main session counts without stacks (cheap on every process); this
//! one, loaded for the process opened and dropped when it is closed, counts
//! by user stack for that process alone.

use std::collections::HashMap;

use memtrace_common::{
    faults::FaultConfig,
    names::{BRK_STACKS, FAULTS, FAULTS_PERF},
    stack_mode,
};

use crate::error::Result;
use crate::output::Shown;
use crate::run::args::Common;
use crate::run::tool::{About, Prep, Tool};
use crate::session::attach::Probe;
use crate::stacks::args::{StackArgs, StackMode};
use crate::stacks::ustack::stack_report;
use crate::stacks::Traced;

/// Stacks shown of each kind.
const TOP: usize = 3;
/// Frames shown of each stack, innermost first.
const FRAMES: usize = 4;

/// The programs of the detail session, as a tool `run::attach` can load.
struct Stacks {
    stack_args: StackArgs,
}

impl Tool for Stacks {
    fn about(&self) -> &'static About {
        &super::ABOUT
    }
    fn what(&self) -> String {
        "fault and brk stacks".into()
    }
    fn probes(&self) -> Vec<Probe> {
        let mut p = crate::probes::counters::fault_probes();
        p.push(crate::probes::counters::brk_probe());
        p
    }
    fn stack_mode(&self) -> u32 {
        stack_mode::USER
    }
    fn user_stacks(&self) -> Option<(&StackArgs, bool)> {
        // Unwound in the kernel (frame pointers where it refuses): nothing
        // per event goes through the ring buffer, which this session does
        // not drain.
        Some((&self.stack_args, false))
    }
    fn prepare(&mut self, k: &mut Prep) -> Result<()> {
        crate::probes::counters::prepare_faults(k, FaultConfig::default(), 4096)?;
        crate::probes::counters::prepare_brk(k)?;
        k.loader.max_entries(BRK_STACKS, 4096);
        Ok(())
    }
    fn events(&self) -> u64 {
        0
    }
}

pub struct Detail {
    pub pid: u32,
    session: Traced,
    comm: String,
}

impl Detail {
    /// Loads and attaches the stack counting for `pid`.
    pub fn open(pid: u32, comm: &str, common: &Common) -> Result<Detail> {
        let mut tool = Stacks {
            stack_args: StackArgs {
                stack_mode: StackMode::Auto,
                stack_size: 16384,
                sample: 1,
                unwinder: crate::stacks::args::Unwinder::Kernel,
                // 8 MiB: one process's files (glibc is ~40,000 rows).
                unwind_table_size: 1 << 20,
            },
        };
        let mut common = common.clone();
        (common.pid, common.children, common.command) = (Some(pid), false, None);
        let session = crate::run::attach(&mut tool, &common, Some(pid), false)?;
        // Its maps now, so its stacks symbolize even after it exits.
        session.sym.maps.lock().unwrap().snapshot(pid);
        Ok(Detail {
            pid,
            session,
            comm: comm.to_string(),
        })
    }

    /// The top stacks since it was opened, as text lines.
    pub fn lines(&mut self) -> Vec<String> {
        let s = &mut self.session;
        // Libraries it loaded since: their tables (misses are read from
        // their map, not from the undrained ring buffer).
        s.sym.maps.lock().unwrap().refresh_missed();
        let mut out = Vec::new();
        let mut faults: HashMap<(i32, u32), u64> = HashMap::new();
        for map in [FAULTS, FAULTS_PERF] {
            for (k, v) in s.read_folded(map, false).unwrap_or_default() {
                *faults.entry((k.ustack, k.ustack_check as u32)).or_default() += v.count;
            }
        }
        // Stacks that differ only in offsets read the same by function:
        // merged, as the other tools print them.
        let mut by_text: HashMap<String, (u64, u64)> = HashMap::new();
        for ((ustack, check), n) in faults {
            let r = stack_report(
                s,
                self.pid,
                self.comm.clone(),
                (ustack, check, -1),
                stack_mode::USER,
                n,
                None,
            );
            by_text.entry(frames(&r.user)).or_default().0 += n;
        }
        out.push("top page-fault stacks since opened:".to_string());
        for (text, (n, _)) in top(by_text) {
            out.push(format!("  {n} faults: {text}"));
        }
        let mut by_text: HashMap<String, (u64, u64)> = HashMap::new();
        for (k, v) in s.read_folded(BRK_STACKS, false).unwrap_or_default() {
            let r = stack_report(
                s,
                self.pid,
                self.comm.clone(),
                (k.ustack, k.ustack_check, -1),
                stack_mode::USER,
                v.count,
                Some(v.bytes),
            );
            let e = by_text.entry(frames(&r.user)).or_default();
            (e.0, e.1) = (e.0 + v.count, e.1 + v.bytes);
        }
        out.push("top heap-growth (brk) stacks since opened:".to_string());
        for (text, (n, bytes)) in top(by_text) {
            out.push(format!("  {n} calls, {} kB: {text}", bytes >> 10));
        }
        out
    }
}

/// The `TOP` largest by count.
fn top(m: HashMap<String, (u64, u64)>) -> Vec<(String, (u64, u64))> {
    let mut v: Vec<_> = m.into_iter().collect();
    v.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then_with(|| a.0.cmp(&b.0)));
    v.truncate(TOP);
    v
}

fn frames(f: &[Shown]) -> String {
    if f.is_empty() {
        return "[no user stack]".into();
    }
    let mut s: Vec<&str> = f.iter().take(FRAMES).map(|x| &**x).collect();
    if f.len() > FRAMES {
        s.push("...");
    }
    s.join(" < ")
}
