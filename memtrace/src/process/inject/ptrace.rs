//! Every thread of a process held still by ptrace (seized, then
//! interrupted), its memory written through /proc/PID/mem, and a function
//! called in one of its threads: what loading memleak's shim into a
//! running process needs, without gdb.
//!
//! Held threads are let go on drop (PTRACE_DETACH), each with any signal
//! that arrived while it was held, so the process goes on as it was.
//! memtrace ending without a drop (SIGKILL) detaches them in the kernel.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

/// How long a called function may take (dlopen reads and maps a file).
#[cfg(target_arch = "x86_64")]
const CALL_LIMIT: Duration = Duration::from_secs(5);
/// How long a thread may take to stop once interrupted (one in an
/// uninterruptible sleep stops when it wakes).
const STOP_LIMIT: Duration = Duration::from_secs(2);

pub struct Held {
    pub(super) pid: u32,
    pub(super) tids: Vec<i32>,
    /// Signals that stopped a thread while held: given back at detach.
    pub(super) pending: HashMap<i32, i32>,
    pub(super) mem: File,
    /// A thread whose call did not return in time: the process is left
    /// stopped at detach, never resumed mid-call.
    stuck: Option<i32>,
}

fn ptrace(req: libc::c_uint, tid: i32, addr: usize, data: usize) -> io::Result<libc::c_long> {
    // SAFETY: requests that take an address and a word or a pointer to a
    // buffer of the kernel's size, which the callers pass.
    let r = unsafe {
        libc::ptrace(
            req,
            tid,
            addr as *mut libc::c_void,
            data as *mut libc::c_void,
        )
    };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// A stop of `tid`: Some(signal) for a signal-delivery stop, None for an
/// event or interrupt stop; an error when it exited.
fn wait_stop(tid: i32, deadline: Option<Instant>) -> io::Result<Option<i32>> {
    loop {
        let mut status = 0;
        let flags = libc::__WALL | if deadline.is_some() { libc::WNOHANG } else { 0 };
        // SAFETY: a status word to fill.
        let r = unsafe { libc::waitpid(tid, &mut status, flags) };
        if r == -1 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            if deadline.is_some_and(|d| Instant::now() > d) {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "timed out"));
            }
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            return Err(io::Error::new(io::ErrorKind::NotFound, "the thread exited"));
        }
        if libc::WIFSTOPPED(status) {
            let sig = libc::WSTOPSIG(status);
            let event = status >> 16;
            return Ok((event == 0 && sig != libc::SIGTRAP).then_some(sig));
        }
    }
}

fn tasks(pid: u32) -> io::Result<Vec<i32>> {
    let mut t: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    t.sort();
    Ok(t)
}

impl Held {
    /// Seizes and interrupts every thread of `pid`, again until no thread
    /// is left that a running one started meanwhile.
    pub fn all(pid: u32) -> io::Result<Held> {
        let mem = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))?;
        let mut h = Held {
            pid,
            tids: Vec::new(),
            pending: HashMap::new(),
            mem,
            stuck: None,
        };
        loop {
            let fresh: Vec<i32> = tasks(pid)?
                .into_iter()
                .filter(|t| !h.tids.contains(t))
                .collect();
            if fresh.is_empty() {
                break;
            }
            for tid in fresh {
                match ptrace(libc::PTRACE_SEIZE, tid, 0, 0) {
                    Ok(_) => {}
                    // Gone between the listing and the seize.
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => continue,
                    Err(e) => return Err(e),
                }
                h.tids.push(tid);
                ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0)?;
                match wait_stop(tid, Some(Instant::now() + STOP_LIMIT)) {
                    Ok(Some(sig)) => {
                        h.pending.insert(tid, sig);
                    }
                    Ok(None) => {}
                    Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!(
                                "thread {tid} did not stop in {} s (an uninterruptible sleep?)",
                                STOP_LIMIT.as_secs()
                            ),
                        ))
                    }
                    Err(_) => h.tids.retain(|&t| t != tid),
                }
            }
        }
        if h.tids.is_empty() {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no thread left"));
        }
        Ok(h)
    }

    pub fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        self.mem.read_exact_at(buf, addr)
    }

    pub fn read_u64(&self, addr: u64) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// Writes through the process's protections (as a debugger does), so
    /// a read-only relocated table takes the write as a private copy.
    pub fn write(&self, addr: u64, data: &[u8]) -> io::Result<()> {
        self.mem.write_all_at(data, addr)
    }

    /// A NUL-terminated string of the process (at most `max` bytes).
    pub fn string(&self, addr: u64, max: usize) -> String {
        let mut b = vec![0u8; max];
        let n = (0..max)
            .step_by(64)
            .take_while(|&i| {
                self.read(addr + i as u64, &mut b[i..(i + 64).min(max)])
                    .is_ok()
            })
            .count()
            * 64;
        let b = &b[..n.min(max)];
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    }

    pub fn first(&self) -> i32 {
        self.tids[0]
    }

    pub(super) fn pc(&self, tid: i32) -> Option<u64> {
        crate::process::ptregs::pc(tid).ok()
    }

    /// Calls `func(args...)` in thread `tid` and returns what it returned.
    /// `data` is copied below the thread's stack; an argument equal to
    /// [`DATA`] is replaced by its address. The thread's registers (and
    /// vector state) are put back afterwards, whatever happened.
    #[cfg(target_arch = "x86_64")]
    pub fn call(&mut self, tid: i32, func: u64, args: &[u64], data: &[u8]) -> io::Result<u64> {
        // SAFETY: plain register structures, filled by the kernel.
        let mut saved: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        ptrace(libc::PTRACE_GETREGS, tid, 0, &mut saved as *mut _ as usize)?;
        let mut xstate = vec![0u8; 16384];
        let mut iov = libc::iovec {
            iov_base: xstate.as_mut_ptr().cast(),
            iov_len: xstate.len(),
        };
        const NT_X86_XSTATE: usize = 0x202;
        ptrace(
            libc::PTRACE_GETREGSET,
            tid,
            NT_X86_XSTATE,
            &mut iov as *mut _ as usize,
        )?;
        xstate.truncate(iov.iov_len);
        let r = self.run(tid, &saved, func, args, data);
        if self.stuck.is_some() {
            // Mid-call (maybe inside dlopen, its lock held): registers put
            // back now would run on with the lock taken. Left stopped.
            return r;
        }
        let put = ptrace(libc::PTRACE_SETREGS, tid, 0, &saved as *const _ as usize);
        let mut iov = libc::iovec {
            iov_base: xstate.as_mut_ptr().cast(),
            iov_len: xstate.len(),
        };
        let put_x = ptrace(
            libc::PTRACE_SETREGSET,
            tid,
            NT_X86_XSTATE,
            &mut iov as *mut _ as usize,
        );
        put.and(put_x)?;
        r
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn call(&mut self, _: i32, _: u64, _: &[u64], _: &[u8]) -> io::Result<u64> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "calls into a process are x86-64 only",
        ))
    }

    #[cfg(target_arch = "x86_64")]
    fn run(
        &mut self,
        tid: i32,
        saved: &libc::user_regs_struct,
        func: u64,
        args: &[u64],
        data: &[u8],
    ) -> io::Result<u64> {
        // Past the red zone, 16-aligned; the return address 0 ends the call
        // with a fault at 0, which is caught here and never delivered.
        let data_at = (saved.rsp - 1024 - data.len() as u64) & !15;
        let sp = data_at - 8;
        self.write(data_at, data)?;
        self.write(sp, &0u64.to_ne_bytes())?;
        let mut r = *saved;
        let arg = |i: usize| match args.get(i) {
            Some(&DATA) => data_at,
            Some(&v) => v,
            None => 0,
        };
        (r.rdi, r.rsi, r.rdx, r.rcx, r.r8, r.r9) = (arg(0), arg(1), arg(2), arg(3), arg(4), arg(5));
        r.rip = func;
        r.rsp = sp;
        r.rax = 0;
        // Not in a system call: no restart may move rip.
        r.orig_rax = u64::MAX;
        ptrace(libc::PTRACE_SETREGS, tid, 0, &r as *const _ as usize)?;
        let deadline = Instant::now() + CALL_LIMIT;
        ptrace(libc::PTRACE_CONT, tid, 0, 0)?;
        loop {
            match wait_stop(tid, Some(deadline)) {
                Ok(Some(libc::SIGSEGV)) => {
                    ptrace(libc::PTRACE_GETREGS, tid, 0, &mut r as *mut _ as usize)?;
                    if r.rip == 0 {
                        return Ok(r.rax);
                    }
                    return Err(io::Error::other(format!(
                        "the call faulted at {:#x}",
                        r.rip
                    )));
                }
                Ok(Some(sig)) => {
                    self.pending.insert(tid, sig);
                }
                Ok(None) => {}
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                    // Waiting on a lock someone held, or worse: the whole
                    // process is left stopped (at detach) and said, never
                    // resumed in the middle of the call.
                    let _ = ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0);
                    let _ = wait_stop(tid, Some(Instant::now() + STOP_LIMIT));
                    self.stuck = Some(tid);
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the call did not return in {} s: pid {} is left stopped (SIGSTOP) \
                             rather than resumed mid-call, for you to inspect: resumed (kill -CONT), \
                             the call goes on and its return faults, which ends the process",
                            CALL_LIMIT.as_secs(),
                            self.pid
                        ),
                    ));
                }
                Err(e) => return Err(e),
            }
            ptrace(libc::PTRACE_CONT, tid, 0, 0)?;
        }
    }
}

/// An argument that stands for the address of the call's data.
pub const DATA: u64 = u64::MAX - 0x4d54;

impl Drop for Held {
    fn drop(&mut self) {
        if self.stuck.is_some() {
            // A group stop, which outlasts the detach.
            // SAFETY: a signal to a process memtrace holds.
            unsafe { libc::kill(self.pid as i32, libc::SIGSTOP) };
        }
        for &tid in &self.tids {
            let sig = self.pending.get(&tid).copied().unwrap_or(0);
            let _ = ptrace(libc::PTRACE_DETACH, tid, 0, sig as usize);
        }
    }
}
