//! A breakpoint at a traced program's entry point (`-c` with in-kernel
//! unwinding): at its exec only the program and the dynamic loader are
//! mapped; at its entry, every library it links is too, and memtrace reads
//! its maps there, so the program's own code runs with every unwind table
//! in place.

use std::collections::HashMap;

use libc::pid_t;

/// The program's entry (`AT_ENTRY`), from its auxiliary vector.
fn entry_of(pid: pid_t) -> Option<u64> {
    let auxv = std::fs::read(format!("/proc/{pid}/auxv")).ok()?;
    auxv.chunks_exact(16).find_map(|kv| {
        let k = u64::from_ne_bytes(kv[..8].try_into().ok()?);
        let v = u64::from_ne_bytes(kv[8..].try_into().ok()?);
        (k == libc::AT_ENTRY).then_some(v)
    })
}

/// Breakpoints set, by process: (entry, the word they replaced).
#[derive(Default)]
pub struct EntryStops {
    armed: HashMap<pid_t, (u64, u64)>,
}

impl EntryStops {
    /// Puts an int3 on stopped process `pid`'s entry point.
    pub fn arm(&mut self, pid: pid_t) {
        let Some(entry) = entry_of(pid) else {
            return;
        };
        // SAFETY: ptrace requests on a stopped tracee; errno tells a word
        // that reads as -1 from a failure.
        unsafe {
            *libc::__errno_location() = 0;
            let word = libc::ptrace(libc::PTRACE_PEEKTEXT, pid, entry, 0) as u64;
            if *libc::__errno_location() != 0 {
                return;
            }
            let trap = (word & !0xff) | 0xcc;
            if libc::ptrace(libc::PTRACE_POKETEXT, pid, entry, trap) == 0 {
                self.armed.insert(pid, (entry, word));
            }
        }
    }

    /// At a SIGTRAP stop of `pid`: true when it is the entry breakpoint,
    /// which is then removed and the instruction it stood on run as if it
    /// had never been there.
    pub fn hit(&mut self, pid: pid_t) -> bool {
        let Some(&(entry, word)) = self.armed.get(&pid) else {
            return false;
        };
        // SAFETY: as above; `regs` is written by the kernel.
        unsafe {
            let mut regs: libc::user_regs_struct = std::mem::zeroed();
            if libc::ptrace(libc::PTRACE_GETREGS, pid, 0, &mut regs) < 0 || regs.rip != entry + 1 {
                return false;
            }
            self.armed.remove(&pid);
            regs.rip = entry;
            libc::ptrace(libc::PTRACE_POKETEXT, pid, entry, word);
            libc::ptrace(libc::PTRACE_SETREGS, pid, 0, &regs);
        }
        true
    }

    /// `pid` exec'd or exited: its breakpoint went with its image.
    pub fn forget(&mut self, pid: pid_t) {
        self.armed.remove(&pid);
    }
}
