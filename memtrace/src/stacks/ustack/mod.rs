//! User and kernel stacks: which way user stacks are taken (`--stack-mode`,
//! setup.rs), stack ids decoded, stacks looked up and symbolized, and
//! stack-keyed counts turned into reports.

use memtrace_common::{
    kunwind::mark,
    names, stack_mode,
    stacks::{
        ustack_key, UserStack, USTACK_FOLDED, USTACK_IN_SAMPLE, USTACK_NOT_SAMPLED, USTACK_SPILLED,
    },
};

use crate::output::{Shown, StackReport};
use crate::stacks::Traced;

mod sampled;
mod setup;
pub use sampled::{resolve_exited_samples, sampled_reports, sampled_title};
pub(crate) use setup::setup;

/// The frames shown for the folded stacks of an exited process.
pub const FOLDED: &str = "[stacks of this exited process folded: memtrace's bound on kept counts]";

/// The frame of a process's counts taken while the count map was full.
pub const SPILLED: &str = "[count map full: stacks not kept (raise --keys)]";

/// A stack id as the kernel programs store it in keys and records: an id in
/// a stack map, or one of the negative sentinels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackRef {
    /// In STACKS (kernel stacks; user stacks the kernel walked) or USTACKS
    /// (user stacks walked by the program).
    Id(u32),
    /// The capture failed (counted in stack_fail or stack_copy_fail).
    Failed,
    /// A copied stack, sent just before the record (dwarf mode).
    InSample,
    /// Left out by `--sample`.
    NotSampled,
    /// An exited process's stacks folded into one count (long runs).
    Folded,
    /// Counted by process while the count map was full.
    Spilled,
}

impl StackRef {
    pub fn from_raw(id: i32) -> StackRef {
        match id {
            USTACK_IN_SAMPLE => StackRef::InSample,
            USTACK_NOT_SAMPLED => StackRef::NotSampled,
            USTACK_FOLDED => StackRef::Folded,
            USTACK_SPILLED => StackRef::Spilled,
            i if i >= 0 => StackRef::Id(i as u32),
            _ => StackRef::Failed,
        }
    }
}

impl Traced {
    /// Instruction pointers of stack `id` in STACKS, innermost first.
    pub fn stack(&self, id: i32) -> Option<Vec<u64>> {
        let StackRef::Id(id) = StackRef::from_raw(id) else {
            return None;
        };
        let m = self.bpf.map(names::STACKS.name)?;
        let st = aya::maps::StackTraceMap::try_from(m).ok()?;
        let trace = st.get(&id, 0).ok()?;
        Some(trace.frames().iter().map(|f| f.ip).collect())
    }

    /// Instruction pointers of user stack `id`, innermost first; `check` as
    /// `StackStore::get` takes it (0 when the record has none).
    pub fn user_stack(&mut self, id: i32, check: u32) -> Option<Vec<u64>> {
        if !self.walked_user_stacks {
            return self.stack(id);
        }
        let StackRef::Id(id) = StackRef::from_raw(id) else {
            return None;
        };
        // A whole check names the key in the kernel's map, where a stack
        // stays until the next harvest.
        if check > 0xffff {
            let key = ustack_key(id as i32, check);
            if let Some(s) = self.hash_get::<u64, UserStack>(names::USTACKS, &key) {
                return Some(s.ips[..(s.nr as usize).min(s.ips.len())].to_vec());
            }
        } else if check == 0 {
            // A record's stack, stored just before it: harvested first, or
            // the store could give the stack kept last under its id before.
            let _ = self.harvest_user_stacks();
        }
        if let Some(ips) = self.stacks.peek(id, check) {
            return Some(ips);
        }
        // A fault's key holds part of the check: its stack may still wait
        // in the kernel's map. Once a millisecond at most, for rows whose
        // stacks were let go.
        if check != 0 && self.harvested.elapsed() >= std::time::Duration::from_millis(1) {
            let _ = self.harvest_user_stacks();
        }
        self.stacks.get(id, check)
    }

    /// Symbolized user stack `id` (and `check`) of `pid`, or why there is none.
    pub fn user_frames(&mut self, pid: u32, id: i32, check: u32) -> Vec<Shown> {
        self.thread_user_frames(pid, None, id, check)
    }

    /// The same, where the record names its thread: in dwarf mode the stack
    /// is the one that thread copied just before.
    pub fn thread_user_frames(
        &mut self,
        pid: u32,
        tid: Option<u32>,
        id: i32,
        check: u32,
    ) -> Vec<Shown> {
        match StackRef::from_raw(id) {
            StackRef::NotSampled => vec!["[not sampled (--sample)]".into()],
            StackRef::Folded => vec![FOLDED.into()],
            StackRef::Spilled => vec![SPILLED.into()],
            StackRef::InSample => {
                let Some((ips, end)) = self.dwarf.as_mut().and_then(|d| d.take_last(pid, tid))
                else {
                    return vec!["[copied stack not received (counted in ringbuf_full)]".into()];
                };
                let mut frames = self.sym.user(pid, &ips);
                frames.extend(end.note().map(|n| format!("[{n}]").into()));
                frames
            }
            StackRef::Failed => Vec::new(),
            StackRef::Id(_) => match self.user_stack(id, check) {
                Some(ips) => {
                    // Python's frames follow the native ones.
                    let (native, py) = crate::stacks::python::split(&ips);
                    let mut ips = native.to_vec();
                    // An in-kernel unwind that stopped early ends with why.
                    let end = ips.last().and_then(|&ip| mark::note(ip));
                    if end.is_some() {
                        ips.pop();
                    }
                    let mut frames = self.sym.user(pid, &ips);
                    if let Some(py) = py {
                        let types = self.sym.python_types(py.tgid);
                        let pf = self.sym.python.frames(&py, types);
                        frames = crate::stacks::python::merge(frames, &pf);
                    }
                    frames.extend(end.map(|n| format!("[{n}]").into()));
                    frames
                }
                None => Vec::new(),
            },
        }
    }

    /// A kernel stack, without the frames of the tracing machinery that ran
    /// memtrace's program (`bpf_prog_*`, `bpf_trace_run*`, `__traceiter_*`,
    /// `perf_trace_*`...): they are memtrace's, not the workload's.
    pub fn kernel_frames(&mut self, id: i32) -> Vec<Shown> {
        let mut frames = match self.stack(id) {
            Some(ips) => self.sym.kernel(&ips),
            None => Vec::new(),
        };
        let ours = frames.iter().take_while(|f| is_tracing_frame(f)).count();
        frames.drain(..ours);
        frames
    }
}

/// A frame of the code that runs BPF programs, innermost in a stack the
/// program itself captured.
fn is_tracing_frame(f: &str) -> bool {
    const PREFIXES: [&str; 9] = [
        "perf_syscall_",
        "bpf_prog_",
        "bpf_trace_run",
        "__bpf_trace_",
        "__traceiter_",
        "perf_trace_",
        "trace_call_bpf",
        "perf_tp_event",
        "bpf_get_stack",
    ];
    PREFIXES.iter().any(|p| f.starts_with(p)) || f.starts_with("0x")
}

/// Addresses no file placed differ from process to process (ASLR); once
/// the process is gone they never will be placed. As one frame, its stacks
/// merge with its kind's: a churn's short-lived processes, whose maps were
/// never read, made one row each (19,589 of 20,382 rows).
pub(super) fn placed_once_gone(pid: u32, user: Vec<Shown>) -> Vec<Shown> {
    use crate::stacks::symbolize::text;
    match user.iter().any(|f| text::unplaced(f)) && !crate::process::proc::alive(pid) {
        true => text::placeless(user),
        false => user,
    }
}

/// A stack-keyed count, symbolized, for any tool that counts by stack.
pub fn stack_report(
    s: &mut Traced,
    pid: u32,
    comm: String,
    ids: (i32, u32, i32),
    mode: u32,
    count: u64,
    bytes: Option<u64>,
) -> StackReport {
    s.keep_up();
    let (ustack, check, kstack) = ids;
    let user = placed_once_gone(pid, s.user_frames(pid, ustack, check));
    let kernel = s.kernel_frames(kstack);
    let wanted_user = mode & stack_mode::USER != 0;
    let wanted_kernel = mode & stack_mode::KERNEL != 0;
    let failed = |id| StackRef::from_raw(id) == StackRef::Failed;
    let note = if (wanted_user && failed(ustack)) || (wanted_kernel && kstack < 0) {
        Some("stack capture failed (counted in stack_fail)".to_string())
    } else if wanted_user && user.is_empty() && ustack >= 0 {
        Some("stack id no longer in the stack map".to_string())
    } else {
        None
    };
    StackReport {
        pid,
        comm,
        count,
        bytes,
        user,
        kernel,
        note,
        processes: 1,
        alloc: None,
        pids: Vec::new(),
        group: group_of(s, pid),
    }
}

/// The memory cgroup of process `pid`, for a stack's labels.
pub fn group_of(s: &mut Traced, pid: u32) -> Option<String> {
    // Taken out while the maps are read for the id.
    let mut groups = std::mem::take(&mut s.groups);
    let g = groups.of(pid, || {
        let e = s.hash_get(memtrace_common::names::EXEC_NAMES, &pid)?;
        (e.memcg_id != 0).then_some(e.memcg_id)
    });
    s.groups = groups;
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tracing_machinery_is_recognised_and_the_workload_is_not() {
        for f in [
            "bpf_prog_6deef7357e7b4530_oom_tp",
            "bpf_trace_run2",
            "__traceiter_mark_victim",
            "perf_trace_run_bpf_submit",
            "0xffffffffc0a1b2c3",
        ] {
            assert!(is_tracing_frame(f), "{f}");
        }
        for f in [
            "mark_oom_victim",
            "out_of_memory",
            "handle_mm_fault",
            "do_brk_flags",
        ] {
            assert!(!is_tracing_frame(f), "{f}");
        }
    }
}
