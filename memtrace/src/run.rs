//! Life cycle shared by every tool: select the process, load and attach,
//! drain events and intervals, end on Ctrl-C/SIGTERM/SIGHUP, duration or the
//! target's exit, then print the report and summary.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use memtrace_common::{
    kind, stack_mode,
    stacks::{UstackConfig, STACK_SAMPLE_HDR},
    Filter,
};
use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{signal, SignalKind};

use crate::attach::{Method, Probe};
use crate::cli::Common;
use crate::error::{Error, Result};
use crate::kernel::{Format, KernelBtf};
use crate::output::{self, Format as OutFormat, Printer, Summary, Value};
use crate::session::{Loader, Session};
use crate::symbolize::SharedMaps;
use crate::unwind::DwarfStacks;

/// One tool: its probes, its aggregation, its report.
pub trait Tool {
    fn name(&self) -> &'static str;
    /// "OOM kills", for the banner "Tracing OOM kills...".
    fn what(&self) -> String;
    fn probes(&self) -> Vec<Probe>;
    /// `stack_mode` bits the kernel programs should capture.
    fn stack_mode(&self) -> u32 {
        0
    }
    /// The user-stack arguments, for tools that print user stacks, and
    /// whether the tool's events are rare enough to copy every stack.
    fn user_stacks(&self) -> Option<(&crate::cli::StackArgs, bool)> {
        None
    }
    /// Sets the globals and map sizes the tool's programs need.
    fn prepare(&mut self, k: &mut Prep) -> Result<()>;
    fn interval(&self) -> Option<Duration> {
        None
    }
    /// Once attached, before the banner: initial state the kernel needs.
    fn on_start(&mut self, _s: &mut Session) -> Result<()> {
        Ok(())
    }
    /// A ring-buffer record.
    fn on_record(&mut self, _data: &[u8], _s: &mut Session, _out: &mut dyn Printer) -> Result<()> {
        Ok(())
    }
    /// Every interval; return false to end the trace (interval count reached).
    fn on_interval(&mut self, _s: &mut Session, _out: &mut dyn Printer) -> Result<bool> {
        Ok(true)
    }
    /// The final report.
    fn finish(&mut self, _s: &mut Session, _out: &mut dyn Printer) -> Result<()> {
        Ok(())
    }
    /// Events seen, for the summary.
    fn events(&self) -> u64;
    fn summary_extra(&self) -> Vec<(&'static str, Value)> {
        Vec::new()
    }
    fn exit_code(&self) -> i32 {
        0
    }
    /// Folded stacks asked for.
    fn folded(&self) -> bool {
        false
    }
}

/// What `Tool::prepare` can use: the loader, and kernel facts read on demand.
pub struct Prep<'a> {
    pub loader: &'a mut Loader,
    pub filter: Filter,
    /// The attach method forced by `--attach`, if any.
    pub forced: Option<Method>,
}

impl Prep<'_> {
    pub fn btf(&mut self) -> Result<&'static KernelBtf> {
        KernelBtf::shared()
    }

    /// The task/mm/cgroup offsets, set as the `TASK` global.
    pub fn task_offsets(&mut self) -> Result<()> {
        let t = self.btf()?.task_offsets();
        self.loader.global("TASK", &t);
        Ok(())
    }

    pub fn format(&self, cat: &str, name: &str) -> Result<Format> {
        Format::load(cat, name)
    }
}

fn check_root() -> Result<()> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Error::NotRoot);
    }
    Ok(())
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: plain syscall; a valid fd is owned by the caller.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        None
    } else {
        Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    }
}

struct Fd(OwnedFd);
impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// A command run with `-c`, under ptrace so that it is stopped before its
/// first instruction and its maps can be read when it exits.
struct Traced {
    pid: u32,
    go: mpsc::Sender<SharedMaps>,
    exited: tokio::sync::oneshot::Receiver<i32>,
}

fn spawn_traced(cmd: &str) -> Result<Traced> {
    let (pid_tx, pid_rx) = mpsc::channel::<std::result::Result<u32, String>>();
    let (go_tx, go_rx) = mpsc::channel::<SharedMaps>();
    let (exit_tx, exit_rx) = tokio::sync::oneshot::channel::<i32>();
    let cmd = cmd.to_string();
    // ptrace requests must come from the thread that forked the tracee.
    std::thread::spawn(move || {
        use std::os::unix::process::CommandExt;
        let mut c = std::process::Command::new("/bin/sh");
        c.arg("-c").arg(format!("exec {cmd}"));
        // SAFETY: ptrace(TRACEME) is async-signal-safe.
        unsafe {
            c.pre_exec(|| {
                if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = match c.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = pid_tx.send(Err(format!("cannot run '{cmd}': {e}")));
                return;
            }
        };
        let pid = child.id() as libc::pid_t;
        let mut status = 0;
        // The first stop is the SIGTRAP of the exec of /bin/sh; sh then execs
        // the command, which stops again: that is before its first instruction.
        let mut execs = 0;
        loop {
            // SAFETY: waiting for our own child.
            if unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
                let _ = pid_tx.send(Err("waitpid failed".into()));
                return;
            }
            if !libc::WIFSTOPPED(status) {
                let _ = pid_tx.send(Err(format!("'{cmd}' exited before it started")));
                return;
            }
            execs += 1;
            unsafe {
                libc::ptrace(
                    libc::PTRACE_SETOPTIONS,
                    pid,
                    0,
                    libc::PTRACE_O_TRACEEXIT | libc::PTRACE_O_TRACEEXEC | libc::PTRACE_O_EXITKILL,
                )
            };
            if execs >= 2 {
                break;
            }
            unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0, 0) };
        }
        let _ = pid_tx.send(Ok(pid as u32));
        let Ok(maps) = go_rx.recv() else {
            return;
        };
        maps.lock().unwrap().snapshot(pid as u32);
        unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0, 0) };
        loop {
            if unsafe { libc::waitpid(pid, &mut status, libc::__WALL) } < 0 {
                let _ = exit_tx.send(-1);
                return;
            }
            if libc::WIFEXITED(status) {
                let _ = exit_tx.send(libc::WEXITSTATUS(status));
                return;
            }
            if libc::WIFSIGNALED(status) {
                let _ = exit_tx.send(128 + libc::WTERMSIG(status));
                return;
            }
            if libc::WIFSTOPPED(status) {
                let sig = libc::WSTOPSIG(status);
                let event = status >> 16;
                let mut deliver = 0;
                if event == libc::PTRACE_EVENT_EXIT || event == libc::PTRACE_EVENT_EXEC {
                    // Still mapped: keep what symbolization needs after exit.
                    maps.lock().unwrap().snapshot(pid as u32);
                } else if sig != libc::SIGTRAP {
                    deliver = sig;
                }
                unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0, deliver) };
            }
        }
    });
    match pid_rx.recv() {
        Ok(Ok(pid)) => Ok(Traced {
            pid,
            go: go_tx,
            exited: exit_rx,
        }),
        Ok(Err(e)) => Err(Error::Usage(e)),
        Err(_) => Err(Error::Runtime("command runner died".into())),
    }
}

/// Resolves `--stack-mode`, says which was chosen, and sets what the kernel
/// programs need to take user stacks: the register and stack-top offsets,
/// and for dwarf the copy size and a ring buffer to carry the copies.
fn ustack_setup(
    tool: &dyn Tool,
    filter: &mut Filter,
    loader: &mut Loader,
) -> Result<Option<DwarfStacks>> {
    if filter.stacks & stack_mode::USER == 0 {
        return Ok(None);
    }
    let dwarf = match tool.user_stacks() {
        Some((args, rare)) => {
            let auto = args.stack_mode == crate::cli::StackMode::Auto;
            let d = args.dwarf(rare);
            if auto && !d {
                eprintln!(
                    "memtrace: user stacks: fp (auto: too many events to copy each stack; \
                     --stack-mode dwarf --sample N unwinds one in N through code without frame pointers)"
                );
            }
            d.then_some((args, auto))
        }
        None => None,
    };
    let btf = KernelBtf::shared()?;
    let offs = (
        btf.offset("pt_regs", "ip"),
        btf.offset("pt_regs", "sp"),
        btf.offset("pt_regs", "bp"),
        btf.offset("mm_struct", "start_stack"),
    );
    let (Some(ip), Some(sp), Some(bp), Some(top)) = offs else {
        if dwarf.is_some() {
            return Err(Error::NoBtf(
                "no x86-64 pt_regs or mm_struct.start_stack in kernel BTF (needed by --stack-mode dwarf)"
                    .into(),
            ));
        }
        // Elsewhere the kernel's own frame-pointer walker does.
        return Ok(None);
    };
    let mut cfg = UstackConfig {
        stack_bytes: 0,
        sample_every: 1,
        regs_ip: ip,
        regs_sp: sp,
        regs_bp: bp,
        mm_start_stack: top,
        _pad: [0; 2],
    };
    // Both ways find the main thread's stack top through task->mm.
    loader.global("TASK", &btf.task_offsets());
    let Some((args, auto)) = dwarf else {
        filter.stacks |= stack_mode::WALK;
        loader.global("USTACK", &cfg);
        loader.max_entries("USTACKS", 16384);
        return Ok(None);
    };
    cfg.stack_bytes = args.stack_size;
    cfg.sample_every = args.sample;
    filter.stacks |= stack_mode::DWARF;
    loader.global("USTACK", &cfg);
    // One slot per CPU where the sample is put together.
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| Error::Io(e))? as u32;
    loader.max_entries("SAMPLE_SCRATCH", cpus);
    // Room for 32 full copies, and many more of the usual ones (a record is
    // as long as the stack copied): the reader drains it far more often, and
    // the buffer is resident twice over (--buffer-size sets it).
    let record = STACK_SAMPLE_HDR as u32 + cfg.stack_bytes;
    loader.max_entries("EVENTS", (record * 32).next_power_of_two().max(1 << 20));
    let how = if args.sample > 1 {
        format!("one event in {} sampled", args.sample)
    } else {
        "every event".to_string()
    };
    eprintln!(
        "memtrace: user stacks: dwarf{} ({} bytes of stack copied, {how})",
        if auto { " (auto)" } else { "" },
        cfg.stack_bytes
    );
    Ok(Some(DwarfStacks::new(args.sample)))
}

fn fork_probe() -> Probe {
    Probe::new("process forks").tracepoint("follow_fork", "sched", "sched_process_fork")
}

/// With MEMTRACE_TIMING set, prints how long each start-up phase took.
struct Phases(Option<Instant>);

impl Phases {
    fn mark(&mut self, what: &str) {
        if let Some(t) = self.0 {
            eprintln!(
                "memtrace: timing: {what}: {:.1} ms",
                t.elapsed().as_secs_f64() * 1e3
            );
        }
    }
}

/// The EVENTS ring buffer's size in the kernel object, unless a tool sets one.
const DEFAULT_RING_BYTES: u32 = 256 * 1024;

/// How often the ring buffer is drained without a wakeup: batched records
/// wait no longer than this.
const DRAIN_EVERY: Duration = Duration::from_millis(20);

pub fn run(tool: &mut dyn Tool, common: &Common) -> Result<i32> {
    let mut phases = Phases(std::env::var_os("MEMTRACE_TIMING").map(|_| Instant::now()));
    check_root()?;
    crate::kernel::tracefs::root()?;
    // Opened before anything else: it proves the pid exists, and the target's
    // exit is seen even if it comes before the event loop starts.
    let pidfd = match common.pid {
        Some(pid) => Some(pidfd_open(pid).ok_or(Error::NoSuchPid(pid))?),
        None => None,
    };
    let mut traced = match &common.command {
        Some(cmd) => Some(spawn_traced(cmd)?),
        None => None,
    };
    let target = common.pid.or(traced.as_ref().map(|t| t.pid));
    let follow = common.children || traced.is_some();

    let mut loader = Loader::default();
    let mut filter = Filter {
        tgid: target.unwrap_or(0),
        children: follow as u32,
        stacks: tool.stack_mode(),
        fork_child_pid: 0,
    };
    if follow {
        filter.fork_child_pid = Format::load("sched", "sched_process_fork")?.offset("child_pid")?;
        loader.max_entries("FOLLOWED", 8192);
    }
    let dwarf = ustack_setup(tool, &mut filter, &mut loader)?;
    // The kernel's stack map: kernel stacks, and user stacks neither walked
    // in the program nor copied for unwinding.
    let user_by_kernel = filter.stacks & stack_mode::USER != 0
        && filter.stacks & (stack_mode::WALK | stack_mode::DWARF) == 0;
    if filter.stacks & stack_mode::KERNEL != 0 || user_by_kernel {
        loader.max_entries("STACKS", 16384);
    }
    loader.global("FILTER", &filter);
    let mut prep = Prep {
        loader: &mut loader,
        filter,
        forced: common.attach,
    };
    tool.prepare(&mut prep)?;
    if let Some(bytes) = common.buffer_size {
        loader.max_entries("EVENTS", bytes);
    }
    // Streamed records wake memtrace once an eighth of the buffer waits
    // (and a timer drains the rest), not once per record.
    let ring = loader.size_of("EVENTS").unwrap_or(DEFAULT_RING_BYTES);
    loader.global("WAKE_BYTES", &(ring as u64 / 8));
    phases.mark("offsets");

    let mut session = Session::load(&loader, common.attach, common.verbose)?;
    session.dwarf = dwarf;
    session.walked_user_stacks = filter.stacks & stack_mode::WALK != 0;
    phases.mark("object loaded");
    if follow {
        session.attach(&fork_probe())?;
    }
    for p in tool.probes() {
        session.attach(&if common.floor { p.floor() } else { p })?;
    }
    tool.on_start(&mut session)?;
    phases.mark("attached");
    let format = if common.json {
        OutFormat::Json
    } else if tool.folded() {
        OutFormat::Folded
    } else {
        OutFormat::Text
    };
    // Buffered: one write per drained batch of events, not one per line.
    let stdout = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout());
    let mut out = output::printer(format, common.timestamps, Box::new(stdout));
    let scope = match (&common.command, target) {
        (Some(c), _) => format!(" of '{c}'"),
        (None, Some(p)) => format!(" of pid {p}"),
        _ => String::new(),
    };
    // Signal handlers go in before the banner: whoever waits for the banner may
    // signal at once.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::Io)?;
    let signals = {
        let _guard = rt.enter();
        Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        }
    };
    // Snapshot the target's maps now, so its stacks symbolize after it
    // exits; before saying "Tracing", which tells callers we are ready.
    if let Some(p) = common.pid {
        session.sym.maps.lock().unwrap().snapshot(p);
    }
    eprintln!("Tracing {}{scope}... Hit Ctrl-C to end.", tool.what());
    let _ = std::io::stderr().flush();
    let mut exited = None;
    if let Some(t) = traced.as_mut() {
        let _ = t.go.send(session.sym.maps.clone());
        exited = Some(&mut t.exited);
    }

    let started = Instant::now();
    let status = rt.block_on(event_loop(
        tool,
        &mut session,
        out.as_mut(),
        common,
        signals,
        pidfd,
        exited,
    ))?;
    tool.finish(&mut session, out.as_mut())?;
    let mut extra = tool.summary_extra();
    if let Some(d) = &session.dwarf {
        let u = d.unwinder.stats;
        extra.extend([
            ("stack_mode", Value::from("dwarf")),
            ("stack_sample_every", Value::from(d.every as u64)),
            ("stacks_unwound", Value::from(u.samples)),
            ("unwind_complete", Value::from(u.complete)),
            ("unwind_truncated", Value::from(u.truncated)),
            ("unwind_no_info", Value::from(u.no_unwind_info)),
            ("unwind_no_maps", Value::from(u.no_maps)),
            ("unwind_failed", Value::from(u.failed)),
        ]);
    } else if tool.user_stacks().is_some() {
        extra.push(("stack_mode", Value::from("fp")));
    }
    let summary = Summary {
        tool: tool.name(),
        duration_s: started.elapsed().as_secs_f64(),
        events: tool.events(),
        lost: session.losses(),
        attached: session.attached.clone(),
        command_status: status,
        extra,
    };
    out.summary(&summary);
    out.flush();
    // Dropping the session detaches and unloads every program.
    drop(session);
    Ok(tool.exit_code())
}

struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

#[allow(clippy::too_many_arguments)]
async fn event_loop(
    tool: &mut dyn Tool,
    session: &mut Session,
    out: &mut dyn Printer,
    common: &Common,
    mut sig: Signals,
    pidfd: Option<OwnedFd>,
    mut exited: Option<&mut tokio::sync::oneshot::Receiver<i32>>,
) -> Result<Option<i32>> {
    let rb = session.ring_buffer()?;
    // SAFETY: the ring buffer owns its map fd for as long as the AsyncFd lives.
    let mut rb = unsafe { AsyncFd::register(rb) }.map_err(std::io::Error::from)?;
    let far = Duration::from_secs(86400 * 365);
    let deadline = tokio::time::Instant::now() + common.duration.unwrap_or(far);
    let mut interval = tokio::time::interval(tool.interval().unwrap_or(far));
    interval.tick().await;
    let mut housekeeping = tokio::time::interval(Duration::from_millis(250));
    let mut drain = tokio::time::interval(DRAIN_EVERY);
    let pidfd = match pidfd {
        // SAFETY: `Fd` owns the pidfd for as long as the AsyncFd lives.
        Some(fd) => Some(unsafe { AsyncFd::register(Fd(fd)) }.map_err(std::io::Error::from)?),
        None => None,
    };
    let mut warned_loss = 0u64;
    let mut status = None;
    let mut last_maps = Instant::now();
    loop {
        tokio::select! {
            guard = rb.readable_mut() => {
                let mut guard = guard?;
                let ring = guard.get_inner_mut();
                while let Some(item) = ring.next() {
                    dispatch(&item, tool, session, out)?;
                }
                out.flush();
                guard.clear_ready();
            }
            _ = drain.tick() => {
                let ring = rb.get_mut();
                while let Some(item) = ring.next() {
                    dispatch(&item, tool, session, out)?;
                }
                out.flush();
            }
            _ = sig.int.recv() => break,
            _ = sig.term.recv() => break,
            _ = sig.hup.recv() => break,
            _ = tokio::time::sleep_until(deadline) => break,
            _ = interval.tick() => {
                if !tool.on_interval(session, out)? {
                    break;
                }
            }
            _ = housekeeping.tick() => {
                let lost: u64 = session.losses().iter().map(|(_, n)| n).sum();
                if lost > warned_loss {
                    eprintln!("memtrace: warning: {lost} events lost so far (see the summary for why; a bigger --buffer-size keeps more in bursts)");
                    warned_loss = lost;
                }
                if let (Some(p), true) = (common.pid, last_maps.elapsed() > Duration::from_secs(1)) {
                    session.sym.maps.lock().unwrap().snapshot(p);
                    last_maps = Instant::now();
                }
            }
            r = async { pidfd.as_ref().unwrap().readable().await }, if pidfd.is_some() => {
                let _ = r;
                break;
            }
            st = async { exited.as_mut().unwrap().await }, if exited.is_some() => {
                status = Some(st.unwrap_or(-1));
                break;
            }
        }
    }
    // Whatever is still in the buffer belongs to the report.
    let ring = rb.get_mut();
    while let Some(item) = ring.next() {
        dispatch(&item, tool, session, out)?;
    }
    Ok(status)
}

/// Copied stacks go to the unwinder, every other record to the tool.
fn dispatch(
    item: &[u8],
    tool: &mut dyn Tool,
    session: &mut Session,
    out: &mut dyn Printer,
) -> Result<()> {
    if item.get(..4) == Some(&kind::STACK_SAMPLE.to_ne_bytes()) {
        if let Some(d) = session.dwarf.as_mut() {
            d.add(&mut session.sym.maps.lock().unwrap(), item);
        }
        return Ok(());
    }
    tool.on_record(item, session, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{StackArgs, StackMode};

    struct Stacks(StackArgs);
    impl Tool for Stacks {
        fn name(&self) -> &'static str {
            "test"
        }
        fn what(&self) -> String {
            String::new()
        }
        fn probes(&self) -> Vec<Probe> {
            Vec::new()
        }
        fn prepare(&mut self, _: &mut Prep) -> Result<()> {
            Ok(())
        }
        fn events(&self) -> u64 {
            0
        }
        fn user_stacks(&self) -> Option<(&StackArgs, bool)> {
            Some((&self.0, false))
        }
    }

    /// Both ways of taking user stacks read the main thread's stack top
    /// through task->mm: the task offsets must be set whatever the tool sets.
    #[test]
    fn user_stacks_get_the_task_offsets_they_read_through() {
        for mode in [StackMode::Fp, StackMode::Dwarf] {
            let tool = Stacks(StackArgs {
                stack_mode: mode,
                stack_size: 4096,
                sample: 1,
            });
            let mut filter = Filter {
                stacks: stack_mode::USER,
                ..Default::default()
            };
            let mut loader = Loader::default();
            let dwarf = ustack_setup(&tool, &mut filter, &mut loader).unwrap();
            assert_eq!(dwarf.is_some(), mode == StackMode::Dwarf);
            let names: Vec<_> = loader.global_names().collect();
            assert!(names.contains(&"TASK"), "{mode:?}: {names:?}");
            assert!(names.contains(&"USTACK"), "{mode:?}: {names:?}");
        }
    }
}
