//! Life cycle shared by every tool: select the process, load and attach,
//! drain events and intervals, end on Ctrl-C/SIGTERM/SIGHUP, duration or the
//! target's exit, then print the report and summary.

pub mod args;
mod attach;
mod events;
pub mod losses;
mod oomadj;
pub mod tool;

pub use attach::attach;
pub(crate) use attach::attach_with;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Instant;

use tokio::signal::unix::{signal, SignalKind};

use crate::error::{Error, Result};
use crate::output::frame::FrameStyle;
use crate::output::{self, Format as OutFormat, Summary, Value};
use crate::run::args::Common;
use crate::run::events::{event_loop, Signals};
use crate::run::tool::Tool;

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: plain syscall; a valid fd is owned by the caller.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        None
    } else {
        Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    }
}

/// The error for a `-p` target that exited before its probes were in
/// (its pidfd polls readable), if it did.
fn gone_in_set_up(pid: Option<u32>, fd: Option<&OwnedFd>) -> Option<Error> {
    let (pid, fd) = (pid?, fd?);
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd, no wait.
    let exited = unsafe { libc::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLIN != 0 };
    exited.then(|| {
        Error::Usage(format!(
            "-p {pid}: process {pid} exited while memtrace was setting up: nothing was traced"
        ))
    })
}

/// A file of memtrace's own, removed when the run ends.
struct TempFile(std::path::PathBuf);

impl TempFile {
    /// A new file of memtrace's in the temporary directory: created here
    /// (a random name, O_EXCL, no symlink followed, mode 0600), so that
    /// what later opens it by name opens it (others cannot rename or
    /// remove root's file in a sticky directory).
    fn new(stem: &str) -> Result<TempFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let r = crate::probes::heap::safe_dir::random_hex().map_err(Error::Output)?;
        let path = std::env::temp_dir().join(format!("{stem}-{}-{r}.rec", std::process::id()));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| {
                Error::Output(std::io::Error::other(format!("{}: {e}", path.display())))
            })?;
        Ok(TempFile(path))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// With MEMTRACE_TIMING set, prints how long each phase of start-up, and
/// of the stop, took.
struct Phases(Option<Instant>);

impl Phases {
    fn mark(&mut self, what: &str) {
        if let Some(t) = self.0 {
            say!(
                "memtrace: timing: {what}: {:.1} ms",
                t.elapsed().as_secs_f64() * 1e3
            );
        }
    }
}

pub fn run(tool: &mut dyn Tool, common: &Common) -> Result<i32> {
    let mut phases = Phases(std::env::var_os("MEMTRACE_TIMING").map(|_| Instant::now()));
    // Build ids are noted as the symbolizer opens files, from the first:
    // memtrace's own libc and ld.so are opened before the record is, and
    // were left out of it.
    if common.record.is_some() || exports(common).any() {
        crate::stacks::buildid::enable();
    }
    // Signal handlers go in before anything is set up: a Ctrl-C, SIGTERM or
    // SIGHUP while probes attach is kept and ends the run as soon as the
    // event loop starts (a report, the summary, nothing left attached),
    // rather than killing memtrace part way, or at whatever step it came.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::Io)?;
    let mut signals = {
        let _guard = rt.enter();
        Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            usr1: signal(SignalKind::user_defined1())?,
        }
    };
    crate::kernel::caps::check()?;
    crate::kernel::tracefs::root()?;
    // Opened before anything else: it proves the pid exists, and the target's
    // exit is seen even if it comes before the event loop starts.
    let pidfd = match common.pid {
        Some(pid) => Some(pidfd_open(pid).ok_or(Error::NoSuchPid(pid))?),
        None => None,
    };
    // A pid that exists but has nothing to trace is bad input too.
    if let Some(why) = common.pid.and_then(crate::process::proc::untraceable) {
        let pid = common.pid.unwrap_or_default();
        return Err(Error::Usage(format!("-p {pid}: process {pid} is {why}")));
    }
    if common
        .command
        .as_deref()
        .is_some_and(|c| c.trim().is_empty())
    {
        return Err(Error::Usage("-c: the command is empty".into()));
    }
    let dest = output::destination(common.output.as_deref())?;
    let protection = oomadj::apply(common.oom_score_adj);
    let mut traced = match &common.command {
        Some(cmd) => Some(crate::process::command::spawn_traced(
            cmd,
            tool.command_env(),
            protection.original.clone(),
        )?),
        None => None,
    };
    let target = common.pid.or(traced.as_ref().map(|t| t.pid));
    let follow = common.children || traced.is_some();

    phases.mark("set up");
    let mut session = match attach(tool, common, target, follow) {
        Ok(s) => s,
        Err(e) => {
            // A signal is seen by its receiver only once the runtime's
            // driver has run: let it run, or a load that the signal cut
            // short (a map or program call interrupted) reads as an error.
            rt.block_on(async { tokio::time::sleep(std::time::Duration::from_millis(20)).await });
            let _guard = rt.enter();
            if signals.stop_pending() {
                say!("memtrace: stopped by a signal during set-up; nothing was attached");
                return Ok(0);
            }
            // Set-up that failed because the target went away says so.
            return Err(gone_in_set_up(common.pid, pidfd.as_ref()).unwrap_or(e));
        }
    };
    // A target gone before its probes were in has nothing traced: bad
    // input (one line, exit 2), not an empty table.
    if let Some(e) = gone_in_set_up(common.pid, pidfd.as_ref()) {
        return Err(e);
    }
    let adopted = match (common.pid, common.children) {
        (Some(p), true) => Some(crate::probes::follow::adopt_descendants(&mut session, p)?),
        _ => None,
    };
    tool.on_start(&mut session)?;
    phases.mark("attached");
    // System-wide, the running processes' unwind tables are built while
    // events already count.
    let has_tables = session.sym.maps.lock().unwrap().ktables.is_some();
    let seeder = (target.is_none() && has_tables)
        .then(|| crate::stacks::ktables::seed::Seeder::start(session.sym.maps.clone()));
    let format = if common.json {
        OutFormat::Json
    } else if tool.folded() {
        OutFormat::Folded
    } else {
        OutFormat::Text
    };
    let mut out = output::printer(format, common.timestamps, dest);
    let top = tool
        .top()
        .or((format == OutFormat::Text).then(|| tool.text_top()));
    out = Box::new(output::MergedStacks(out, common.per_pid, top));
    // --pprof is made from a record: the one asked for, or one of its own
    // (removed however the run ends).
    let exported = exports(common).any();
    let own_record = match exported && common.record.is_none() {
        true => Some(TempFile::new("memtrace-pprof")?),
        false => None,
    };
    let record = common.record.as_ref().or(own_record.as_ref().map(|t| &t.0));
    if let Some(path) = record {
        // The record keeps source lines even when they are not shown.
        let shown = session.sym.style;
        if shown == FrameStyle::Function {
            session.sym.set_style(FrameStyle::Lines);
        }
        out = Box::new(crate::record::Recorder::create(
            out,
            path,
            tool.name(),
            shown,
            common.per_pid,
        )?);
    }
    let scope = match (&common.command, target, adopted) {
        (Some(c), _, _) if crate::process::command::is_simple(c) => format!(" of '{c}'"),
        (Some(c), _, _) => format!(" of '{c}' (the shell and every process it starts)"),
        (None, Some(p), Some(n)) => {
            format!(" of pid {p}, its {n} descendants and the processes they start")
        }
        (None, Some(p), None) => format!(" of pid {p}"),
        _ => String::new(),
    };
    // Snapshot the target's maps now, so its stacks symbolize after it
    // exits; before saying "Tracing", which tells callers we are ready.
    if let Some(p) = common.pid {
        session.sym.maps.lock().unwrap().snapshot(p);
        phases.mark("target's maps read (and unwind tables built)");
    }
    if !protection.said.is_empty() {
        say!("{}", protection.said);
    }
    say!("Tracing {}{scope}... Hit Ctrl-C to end.", tool.what());
    let mut exited = None;
    if let Some(t) = traced.as_mut() {
        let _ = t.go.send(session.sym.maps.clone());
        exited = Some(&mut t.exited);
    }

    let started = Instant::now();
    let (status, counted_out, warned_loss) = rt.block_on(event_loop(
        tool,
        &mut session,
        out.as_mut(),
        common,
        signals,
        pidfd,
        exited,
    ))?;
    // After the last of COUNT interval reports there is nothing more to say
    // (as BCC's `tool 1 3`): only a run cut short reports what is left.
    let mut stopping = Phases(phases.0.map(|_| Instant::now()));
    session.end_counting();
    // The probes go while the report is made, not after it.
    let detaching = session.detach_in_background();
    if !counted_out {
        tool.finish(&mut session, out.as_mut())?;
    }
    // Ended before its command (-d, a signal, COUNT): the report above is
    // the state then; the command is ended as timeout ends one, or left.
    use crate::process::command::Ended;
    let (status, ended_by) = match (status, traced.as_mut(), common.command.as_deref()) {
        (None, Some(t), Some(cmd)) => match rt.block_on(t.end(cmd, common.keep_command)) {
            Ended::Exited(s) => (Some(s), None),
            Ended::Term(s) => (Some(s), Some("SIGTERM")),
            Ended::Kill(s) => (Some(s), Some("SIGKILL")),
            Ended::Left => (None, Some("left running")),
        },
        (s, _, _) => (s, None),
    };
    // A run shorter than one housekeeping tick still warns of what it lost.
    if let Some(w) = crate::run::losses::warning(&session.losses(), &warned_loss) {
        say!("{w}");
    }
    out.flush();
    // A report that could not be written has no summary: the error says why.
    output::check(out.as_ref())?;
    let seeded = seeder.map(|s| s.finish());
    let mut extra = tool.summary_extra();
    if let Some(how) = ended_by {
        extra.push(("command_ended_by_memtrace", Value::from(how)));
    }
    if let Some(d) = &session.dwarf {
        let u = d.unwinder.stats;
        let (files, bytes) = d.unwinder.held();
        extra.extend([
            ("stack_mode", Value::from("dwarf")),
            ("unwinder", Value::from("copy")),
            ("stack_sample_every", Value::from(d.every as u64)),
            ("stacks_unwound", Value::from(u.samples)),
            ("unwind_complete", Value::from(u.complete)),
            ("unwind_truncated", Value::from(u.truncated)),
            ("unwind_no_info", Value::from(u.no_unwind_info)),
            ("unwind_no_maps", Value::from(u.no_maps)),
            ("unwind_failed", Value::from(u.failed)),
            ("unwind_info_files", Value::from(files as u64)),
            ("unwind_info_bytes", Value::from(bytes as u64)),
            // Samples of exited processes resolved to rows as they exited.
            ("samples_resolved", Value::from(d.samples.resolved_keys)),
        ]);
    } else if let Some(t) = session
        .sym
        .maps
        .lock()
        .unwrap()
        .ktables
        .as_ref()
        .map(|k| k.stats)
    {
        extra.push(("stack_mode", Value::from("dwarf")));
        extra.push(("unwinder", Value::from("kernel")));
        extra.extend(crate::stacks::ktables::summary(&session, &t, seeded));
    } else if tool.user_stacks().is_some() {
        extra.push(("stack_mode", Value::from("fp")));
    }
    if session.walked_user_stacks {
        // What the stack store holds, let go under its bound, and let go
        // once no count named it.
        extra.push((
            "user_stacks_kept",
            Value::from(session.stacks.kept() as u64),
        ));
        extra.push(("user_stacks_evicted", Value::from(session.stacks.evicted)));
        extra.push(("user_stacks_released", Value::from(session.stacks.released)));
    }
    let own = session.own_faults();
    if own > 0 {
        extra.push(("own_faults_skipped", Value::from(own)));
    }
    let summary = Summary {
        tool: tool.name(),
        duration_s: started.elapsed().as_secs_f64(),
        events: tool.events(),
        lost: session.losses(),
        degraded: session.degraded(),
        apart: session.apart(),
        attached: session.attached.clone(),
        command_status: status,
        extra,
    };
    out.summary(&summary);
    out.flush();
    output::check(out.as_ref())?;
    // Dropping the session unloads every program (as it does when an
    // error returns early), once every probe is detached.
    if let (true, Some(rec)) = (exported, record) {
        let r = crate::record::format::Recording::open(rec)?;
        crate::record::export(&r, &exports(common))?;
    }
    stopping.mark("stop: report and summary written");
    detaching.wait();
    stopping.mark("stop: probes detached");
    drop(session);
    stopping.mark("stop: programs and maps released");
    // A command's failure is the run's, as with strace and time (not the
    // signal memtrace ended it with).
    Ok(match (tool.exit_code(), status) {
        (0, Some(s)) if s > 0 && ended_by.is_none() => s,
        (code, _) => code,
    })
}

/// Where the run's stacks go at the end, besides the output.
fn exports(common: &Common) -> crate::record::Exports<'_> {
    crate::record::Exports {
        pprof: common.pprof.as_deref(),
        otlp: common.otlp.as_deref(),
        push: common.otlp_push.as_ref(),
    }
}
