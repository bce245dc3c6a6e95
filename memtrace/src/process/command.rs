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

/// What `-c` tells whoever keeps process images (the symbolizer's maps,
/// one wing up): a process exec'd, or its maps are to be read now.
pub trait Images: Send {
    fn exec(&mut self, pid: u32);
    /// Reads `pid`'s maps; false if it is gone.
    fn snapshot(&mut self, pid: u32) -> bool;
    /// Unwound in the kernel: each new image needs its tables before it
    /// runs, so the command stops at its entry.
    fn unwinds_in_kernel(&self) -> bool;
}

pub type SharedImages = Arc<Mutex<dyn Images>>;

/// ptrace's answer, checked: a request that fails leaves the tracee
/// stopped or untraced, which must not pass silently.
fn ptrace(req: libc::c_uint, pid: libc::pid_t, data: usize) -> std::io::Result<()> {
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

/// Whether `cmd` is plain words naming a program the shell can exec as
/// they are: no shell syntax, no variable assignment in front and no
/// builtin such as `cd` (which `exec` cannot run).
pub fn is_simple(cmd: &str) -> bool {
    let plain = cmd
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || " \t_-./,:=+@%".contains(c));
    let Some(first) = cmd.split_whitespace().next() else {
        return false;
    };
    plain && !first.contains('=') && is_program(first)
}

/// A path, or a name found as an executable file in PATH.
fn is_program(word: &str) -> bool {
    word.contains('/') || program_path(word).is_some()
}

/// The file a command word runs: itself when it is a path, else the first
/// executable of that name in PATH.
pub fn program_path(word: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let exec = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if word.contains('/') {
        return Some(word.into());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(word))
        .find(|p| exec(p))
}

/// Every process the command starts is followed the same way (fork, vfork;
/// threads share their process's maps and are left alone), so its maps
/// are read as it execs and as it exits, however short it lives.
const CHILD_OPTS: libc::c_int = libc::PTRACE_O_TRACEFORK | libc::PTRACE_O_TRACEVFORK;

/// Stops `pid` at its entry; a failure is said (the process then runs its
/// first instructions before its libraries' tables are in place).
fn arm(stops: &mut EntryStops, pid: libc::pid_t) {
    match stops.arm(pid) {
        Ok(()) => {}
        // Gone meanwhile: waitpid reports how.
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
        Err(e) => say!(
            "memtrace: warning: cannot stop process {pid} at its entry ({e}): its first \
             events may be unwound before its libraries' tables are in place (tables_pending)"
        ),
    }
}

/// At a SIGTRAP stop: whether `pid` stopped at its entry breakpoint. One
/// whose entry could not be restored would run a broken instruction: it
/// is killed, and said.
fn at_entry(stops: &mut EntryStops, pid: libc::pid_t) -> bool {
    match stops.hit(pid) {
        Ok(hit) => hit,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => false,
        Err(e) => {
            say!("memtrace: error: cannot restore process {pid}'s entry after stopping it there ({e}): killed");
            // SAFETY: a signal to our own tracee.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            false
        }
    }
}

/// Runs the command's process tree to the end of its first process: each
/// process stops at its execs and its exit, where its maps are read; the
/// first process's exit status goes to `exit_tx`. Processes left when it
/// ends keep running (only the command itself dies with memtrace).
fn follow_tree(
    pid: libc::pid_t,
    maps: &SharedImages,
    exit_tx: tokio::sync::oneshot::Sender<i32>,
    mut stops: EntryStops,
    leave: Arc<AtomicBool>,
) {
    let mut exit_tx = Some(exit_tx);
    let mut seen = std::collections::HashSet::from([pid]);
    let kunwind = maps.lock().unwrap().unwinds_in_kernel();
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own tracees.
        let w = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
        if w < 0 {
            // ECHILD: nothing left to wait for.
            if let Some(tx) = exit_tx.take() {
                let _ = tx.send(-1);
            }
            return;
        }
        let code = if libc::WIFEXITED(status) {
            Some(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            Some(128 + libc::WTERMSIG(status))
        } else {
            None
        };
        if let Some(code) = code {
            if w == pid {
                if let Some(tx) = exit_tx.take() {
                    let _ = tx.send(code);
                }
            }
            continue;
        }
        if !libc::WIFSTOPPED(status) {
            continue;
        }
        let sig = libc::WSTOPSIG(status);
        let event = status >> 16;
        if leave.load(Ordering::SeqCst) {
            // --keep-command: every process of the command detached at its
            // next stop, so that memtrace's exit kills none (EXITKILL);
            // memtrace's SIGCONT is not delivered.
            let pass = if event == 0 && sig != libc::SIGCONT && sig != libc::SIGTRAP {
                sig
            } else {
                0
            };
            let _ = ptrace(libc::PTRACE_DETACH, w, pass as usize);
            if w == pid {
                if let Some(tx) = exit_tx.take() {
                    let _ = tx.send(DETACHED);
                }
            }
            continue;
        }
        let mut deliver = 0;
        if event == libc::PTRACE_EVENT_EXEC {
            // The new image, with the one it replaced kept aside.
            maps.lock().unwrap().exec(w as u32);
            stops.forget(w);
            if kunwind {
                arm(&mut stops, w);
            }
        } else if event == 0 && sig == libc::SIGTRAP && at_entry(&mut stops, w) {
            // At its entry: the libraries it links are mapped now.
            maps.lock().unwrap().snapshot(w as u32);
        } else if event == libc::PTRACE_EVENT_EXIT {
            // Still mapped: keep what symbolization needs after exit.
            maps.lock().unwrap().snapshot(w as u32);
        } else if event == 0 && sig == libc::SIGSTOP && seen.insert(w) {
            // A new process's first stop: follow it as its parent is
            // followed, but let it outlive memtrace.
            let opts = libc::PTRACE_O_TRACEEXIT | libc::PTRACE_O_TRACEEXEC | CHILD_OPTS;
            let _ = ptrace(libc::PTRACE_SETOPTIONS, w, opts as usize);
        } else if event == 0 && sig != libc::SIGTRAP {
            deliver = sig;
        }
        // ESRCH: killed meanwhile; waitpid reports how.
        let _ = ptrace(libc::PTRACE_CONT, w, deliver as usize);
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
        // SAFETY: ptrace(TRACEME) is async-signal-safe.
        unsafe {
            c.pre_exec(move || {
                if let Some(adj) = &oom_score_adj {
                    restore_oom_score_adj(adj);
                }
                if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
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

#[cfg(test)]
mod tests {
    use super::is_simple;

    #[test]
    fn only_plain_words_are_exec_d() {
        for c in [
            "python3 x.py",
            "/usr/bin/env A=1 prog --flag=2 a,b",
            "make -j4",
        ] {
            assert!(is_simple(c), "{c}");
        }
        for c in [
            "a; b",
            "a | b",
            "a && b",
            "a > f",
            "echo $HOME",
            "x 'q'",
            "(a)",
            "a &",
            "",
        ] {
            assert!(!is_simple(c), "{c}");
        }
    }
}
