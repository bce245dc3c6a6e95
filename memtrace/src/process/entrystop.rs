//! A breakpoint at a traced program's entry point (`-c` with in-kernel
//! unwinding): at its exec only the program and the dynamic loader are
//! mapped; at its entry, every library it links is too, and memtrace reads
//! its maps there, so the program's own code runs with every unwind table
//! in place.

use std::collections::HashMap;
use std::io;

use libc::pid_t;

use super::ptregs;

/// The program's entry (`AT_ENTRY`), from its auxiliary vector.
fn entry_of(pid: pid_t) -> Option<u64> {
    let auxv = std::fs::read(format!("/proc/{pid}/auxv")).ok()?;
    auxv.chunks_exact(16).find_map(|kv| {
        let k = u64::from_ne_bytes(kv[..8].try_into().ok()?);
        let v = u64::from_ne_bytes(kv[8..].try_into().ok()?);
        (k == libc::AT_ENTRY).then_some(v)
    })
}

/// ptrace's answer as a result.
fn ok(r: libc::c_long) -> io::Result<()> {
    match r {
        0.. => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Breakpoints set, by process: (entry, the word they replaced).
#[derive(Default)]
pub struct EntryStops {
    armed: HashMap<pid_t, (u64, u64)>,
}

impl EntryStops {
    /// Puts a breakpoint on stopped process `pid`'s entry point. An error
    /// leaves the process as it was, unstopped at its entry.
    pub fn arm(&mut self, pid: pid_t) -> io::Result<()> {
        let entry = entry_of(pid)
            .ok_or_else(|| io::Error::other("no entry point in its auxiliary vector"))?;
        // SAFETY: ptrace requests on a stopped tracee; errno tells a word
        // that reads as -1 from a failure.
        unsafe {
            *libc::__errno_location() = 0;
            let word = libc::ptrace(libc::PTRACE_PEEKTEXT, pid, entry, 0) as u64;
            if *libc::__errno_location() != 0 {
                return Err(io::Error::last_os_error());
            }
            let trap = ptregs::with_breakpoint(word);
            ok(libc::ptrace(libc::PTRACE_POKETEXT, pid, entry, trap))?;
            self.armed.insert(pid, (entry, word));
        }
        Ok(())
    }

    /// At a SIGTRAP stop of `pid`: true when it is the entry breakpoint,
    /// which is then removed and the instruction it stood on run as if it
    /// had never been there. An error means the process cannot go on as
    /// it was (its entry or its instruction pointer is not restored).
    pub fn hit(&mut self, pid: pid_t) -> io::Result<bool> {
        let Some(&(entry, word)) = self.armed.get(&pid) else {
            return Ok(false);
        };
        if ptregs::pc(pid)? != entry + ptregs::PC_PAST_BREAKPOINT {
            return Ok(false);
        }
        self.armed.remove(&pid);
        // SAFETY: as above.
        ok(unsafe { libc::ptrace(libc::PTRACE_POKETEXT, pid, entry, word) })?;
        ptregs::set_pc(pid, entry)?;
        Ok(true)
    }

    /// `pid` exec'd or exited: its breakpoint went with its image.
    pub fn forget(&mut self, pid: pid_t) {
        self.armed.remove(&pid);
    }
}
