//! Following the command's process tree under ptrace: each process stops
//! at its execs and its exit (its maps read there) and, unwound in the
//! kernel, at its entry until its tables are in place.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{ptrace, SharedImages, DETACHED};
use crate::process::entrystop::EntryStops;

/// Every process the command starts is followed the same way (fork, vfork;
/// threads share their process's maps and are left alone), so its maps
/// are read as it execs and as it exits, however short it lives.
pub(super) const CHILD_OPTS: libc::c_int = libc::PTRACE_O_TRACEFORK | libc::PTRACE_O_TRACEVFORK;

/// Stops `pid` at its entry; a failure is said (the process then runs its
/// first instructions before its libraries' tables are in place).
pub(super) fn arm(stops: &mut EntryStops, pid: libc::pid_t) {
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
pub(super) fn follow_tree(
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
            // Still mapped: keep what symbolization (and a tool) needs
            // after exit.
            maps.lock().unwrap().exiting(w as u32);
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
