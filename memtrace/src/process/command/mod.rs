//! Running `-c CMD`: the command is started under ptrace, stopped before
//! its first instruction until the probes are attached, and its maps are
//! read again as it exits (still mapped then) so its stacks symbolize.
//!
//! A simple command (words only) is exec'd by the shell, so tracing starts
//! at the command itself, without the shell's own start-up. Anything else
//! (lists, pipelines, redirections, expansions) runs as the shell would run
//! it, and the shell is traced from its first instruction with every
//! process it starts; its exit status is the command's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::process::entrystop::EntryStops;

mod follow;
mod words;

use follow::{arm, follow_tree, CHILD_OPTS};
pub use words::{is_simple, program_path};

/// What `-c` tells whoever keeps process images (the symbolizer's maps,
/// one wing up): a process exec'd, or its maps are to be read now.
pub trait Images: Send {
    fn exec(&mut self, pid: u32);
    /// Reads `pid`'s maps; false if it is gone.
    fn snapshot(&mut self, pid: u32) -> bool;
    /// `pid` is stopped at its exit, its memory still mapped: its maps are
    /// read, and whatever else must be read before they go.
    fn exiting(&mut self, pid: u32) {
        self.snapshot(pid);
    }
    /// Unwound in the kernel: each new image needs its tables before it
    /// runs, so the command stops at its entry.
    fn unwinds_in_kernel(&self) -> bool;
}

pub type SharedImages = Arc<Mutex<dyn Images>>;

/// ptrace's answer, checked: a request that fails leaves the tracee
/// stopped or untraced, which must not pass silently.
pub(super) fn ptrace(req: libc::c_uint, pid: libc::pid_t, data: usize) -> std::io::Result<()> {
    // SAFETY: requests on our own stopped child; no pointers are passed.
    if unsafe { libc::ptrace(req, pid, 0, data) } < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A command run with `-c`, under ptrace so that it is stopped before its
/// first instruction and its maps can be read when it exits.
pub struct Traced {
    pub pid: u32,
    pub go: mpsc::Sender<SharedImages>,
    pub exited: tokio::sync::oneshot::Receiver<i32>,
    /// Set to leave the command running: the following thread detaches it
    /// at its next stop.
    leave: Arc<AtomicBool>,
}

/// Between SIGTERM and SIGKILL when memtrace ends before its command.
pub const GRACE: Duration = Duration::from_secs(5);

/// Sent for the exit status once the command is detached (`--keep-command`).
const DETACHED: i32 = i32::MIN;

/// How a command that outlived its trace was left.
pub enum Ended {
    /// It exited by itself meanwhile (a Ctrl-C reaches it too): its status.
    Exited(i32),
    /// Ended by memtrace's SIGTERM, or SIGKILL: its status.
    Term(i32),
    Kill(i32),
    /// `--keep-command`.
    Left,
}

impl Traced {
    /// The end of a run that ends before its command: left running (`keep`),
    /// or ended as timeout(1) ends one, SIGTERM to it and every process it
    /// started, SIGKILL to those after `GRACE`. Said either way.
    pub async fn end(&mut self, cmd: &str, keep: bool) -> Ended {
        // A Ctrl-C at a terminal went to the command as well.
        let short = Duration::from_millis(100);
        if let Ok(st) = tokio::time::timeout(short, &mut self.exited).await {
            return Ended::Exited(st.unwrap_or(-1));
        }
        if keep {
            self.leave.store(true, Ordering::SeqCst);
            // A stop for the following thread to detach each process at
            // (suppressed), the processes the command started first.
            let mut tree = crate::process::proc::descendants(self.pid);
            tree.push(self.pid);
            for &p in &tree {
                // SAFETY: signals to the command's processes (ESRCH: gone).
                unsafe { libc::kill(p as libc::pid_t, libc::SIGCONT) };
            }
            // Until it is detached, memtrace's exit would kill it.
            return match tokio::time::timeout(short * 10, &mut self.exited).await {
                Ok(Ok(DETACHED)) => {
                    // The others' stops come with the command's.
                    tokio::time::sleep(short).await;
                    say!(
                        "memtrace: '{cmd}' (pid {}) left running (--keep-command)",
                        self.pid
                    );
                    Ended::Left
                }
                Ok(st) => Ended::Exited(st.unwrap_or(-1)),
                Err(_) => {
                    say!(
                        "memtrace: '{cmd}' (pid {}) could not be detached: it ends with memtrace",
                        self.pid
                    );
                    Ended::Kill(128 + libc::SIGKILL)
                }
            };
        }
        let mut tree = crate::process::proc::descendants(self.pid);
        tree.push(self.pid);
        let send = |sig| {
            for &p in &tree {
                // SAFETY: signals to the command's processes (ESRCH: gone).
                unsafe { libc::kill(p as libc::pid_t, sig) };
            }
        };
        say!(
            "memtrace: ending '{cmd}' (pid {}), still running: SIGTERM, then SIGKILL after {} s \
             (--keep-command leaves it running)",
            self.pid,
            GRACE.as_secs()
        );
        send(libc::SIGTERM);
        if let Ok(st) = tokio::time::timeout(GRACE, &mut self.exited).await {
            return Ended::Term(st.unwrap_or(-1));
        }
        say!(
            "memtrace: '{cmd}' still running {} s after SIGTERM: SIGKILL",
            GRACE.as_secs()
        );
        send(libc::SIGKILL);
        Ended::Kill((&mut self.exited).await.unwrap_or(-1))
    }
}

/// Starts `cmd` (with `env` added to memtrace's environment) stopped
/// before its first instruction.
/// `oom_score_adj`: the score the command gets back (memtrace's own was
/// changed for the run).
pub fn spawn_traced(
    cmd: &str,
    env: Vec<(String, String)>,
    oom_score_adj: Option<Vec<u8>>,
) -> Result<Traced> {
    let (pid_tx, pid_rx) = mpsc::channel::<Result<u32>>();
    let (go_tx, go_rx) = mpsc::channel::<SharedImages>();
    let (exit_tx, exit_rx) = tokio::sync::oneshot::channel::<i32>();
    let leave = Arc::new(AtomicBool::new(false));
    let leave_tx = leave.clone();
    let cmd = cmd.to_string();
    // ptrace requests must come from the thread that forked the tracee.
    std::thread::spawn(move || {
        use std::os::unix::process::CommandExt;
        let mut c = std::process::Command::new("/bin/sh");
        let simple = is_simple(&cmd);
        if simple {
            c.arg("-c").arg(format!("exec {cmd}"));
        } else {
            c.arg("-c").arg(&cmd);
        }
        c.envs(env);
        // SAFETY: getpid is async-signal-safe.
        let parent = unsafe { libc::getpid() };
        // SAFETY: ptrace(TRACEME), getppid and _exit are async-signal-safe.
        unsafe {
            c.pre_exec(move || {
                if let Some(adj) = &oom_score_adj {
                    restore_oom_score_adj(adj);
                }
                if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // memtrace killed before the TRACEME: the child was handed
                // to init (or a subreaper), which it would now have as its
                // tracer, stopped for ever at its exec. It never runs.
                if libc::getppid() != parent {
                    libc::_exit(127);
                }
                Ok(())
            });
        }
        let child = match c.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = pid_tx.send(Err(Error::Usage(format!("cannot run '{cmd}': {e}"))));
                return;
            }
        };
        let pid = child.id() as libc::pid_t;
        let mut status = 0;
        // The first stop is the SIGTRAP of the exec of /bin/sh; for a simple
        // command sh then execs it, which stops again: that is before its
        // first instruction.
        let mut execs = 0;
        let start_at = if simple { 2 } else { 1 };
        loop {
            // SAFETY: waiting for our own child.
            if unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
                let _ = pid_tx.send(Err(Error::Runtime("waitpid failed".into())));
                return;
            }
            if !libc::WIFSTOPPED(status) {
                let how = if libc::WIFEXITED(status) {
                    format!("with status {}", libc::WEXITSTATUS(status))
                } else {
                    format!("by signal {}", libc::WTERMSIG(status))
                };
                let _ = pid_tx.send(Err(Error::Usage(format!(
                    "'{cmd}' could not be run: it exited {how} before it started"
                ))));
                return;
            }
            execs += 1;
            let opts = libc::PTRACE_O_TRACEEXIT
                | libc::PTRACE_O_TRACEEXEC
                | libc::PTRACE_O_EXITKILL
                | CHILD_OPTS;
            if let Err(e) = ptrace(libc::PTRACE_SETOPTIONS, pid, opts as usize) {
                let _ = pid_tx.send(Err(Error::Usage(format!(
                    "cannot trace '{cmd}': ptrace: {e}"
                ))));
                return;
            }
            if execs >= start_at {
                break;
            }
            if let Err(e) = ptrace(libc::PTRACE_CONT, pid, 0) {
                let _ = pid_tx.send(Err(Error::Usage(format!(
                    "cannot run '{cmd}': ptrace: {e}"
                ))));
                return;
            }
        }
        let _ = pid_tx.send(Ok(pid as u32));
        let Ok(maps) = go_rx.recv() else {
            return;
        };
        let mut stops = EntryStops::default();
        {
            let mut m = maps.lock().unwrap();
            m.snapshot(pid as u32);
            if m.unwinds_in_kernel() {
                arm(&mut stops, pid);
            }
        }
        if let Err(e) = ptrace(libc::PTRACE_CONT, pid, 0) {
            say!("memtrace: error: cannot start '{cmd}': ptrace: {e}");
            let _ = exit_tx.send(-1);
            return;
        }
        follow_tree(pid, &maps, exit_tx, stops, leave_tx);
    });
    match pid_rx.recv() {
        Ok(Ok(pid)) => Ok(Traced {
            pid,
            go: go_tx,
            exited: exit_rx,
            leave,
        }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::Runtime("command runner died".into())),
    }
}

/// Writes `original` back as this process's score: async-signal-safe, for
/// a forked child before it execs (the buffer was made before the fork).
fn restore_oom_score_adj(original: &[u8]) {
    const CPATH: &[u8] = b"/proc/self/oom_score_adj\0";
    // SAFETY: open/write/close on a NUL-terminated constant path and a
    // buffer that outlives the calls.
    unsafe {
        let fd = libc::open(CPATH.as_ptr() as *const libc::c_char, libc::O_WRONLY);
        if fd >= 0 {
            libc::write(fd, original.as_ptr() as *const libc::c_void, original.len());
            libc::close(fd);
        }
    }
}
