//! Which thread of a held process memtrace may call in, and whether any
//! thread holds the allocator's or the loader's locks: where their code
//! lies in the process, and the holding itself (`hold_calm`).

use super::objects::{file_name, Loaded};
use std::os::unix::fs::FileExt;

use super::ptrace::Held;
use super::{got, no, Result, ALLOCATOR};

/// Where a thread must not be stopped to call in: the C library, the
/// loader and any allocator library (their code runs under their locks).
pub(super) fn busy(libs: &[Loaded]) -> Vec<(u64, u64)> {
    libs.iter()
        .filter(|l| {
            let n = file_name(&l.shown);
            n.starts_with("libc.so") || n.starts_with("ld-linux") || n.contains("alloc")
        })
        .map(|l| l.span)
        .collect()
}

/// The C library's functions, beside `ALLOCATOR`'s, that take the
/// allocator's or the loader's locks: a thread waiting on a futex inside
/// one holds them.
const LOCKING: &[&str] = &[
    "cfree",
    "malloc_trim",
    "malloc_usable_size",
    "mallinfo",
    "mallinfo2",
    "malloc_stats",
    "malloc_info",
    "mallopt",
    "__libc_malloc",
    "__libc_free",
    "__libc_calloc",
    "__libc_realloc",
    "__libc_memalign",
    "__libc_valloc",
    "__libc_pvalloc",
    "dlopen",
    "dlmopen",
    "dlsym",
    "dlvsym",
    "dlclose",
    "dladdr",
    "dladdr1",
    "dlinfo",
    "dl_iterate_phdr",
    "fork",
    "_Fork",
];

/// A condition variable's waits: a thread in one has let go of its mutex.
const COND_WAITS: &[&str] = &[
    "pthread_cond_wait",
    "pthread_cond_timedwait",
    "pthread_cond_clockwait",
];

/// Where return addresses say what a thread waiting on a futex is doing:
/// `held`, inside the allocator or the loader (the loader and any
/// allocator library whole, and in the C library its allocator's and
/// loader's functions, each up to the next export: more, never less);
/// `released`, in a condition variable's wait.
pub(super) struct Locking {
    pub held: Vec<(u64, u64)>,
    pub released: Vec<(u64, u64)>,
}

pub(super) fn locking(pid: u32, libs: &[Loaded]) -> Locking {
    let mut out = Vec::new();
    let mut released = Vec::new();
    let maps = crate::process::maps::read_maps(pid).unwrap_or_default();
    for l in libs {
        let n = file_name(&l.shown);
        if n.starts_with("ld-linux") || n.contains("alloc") {
            // Their code: their data holds the threads' own list links.
            out.extend(
                maps.iter()
                    .filter(|m| *m.path == *l.shown && m.perms.contains('x'))
                    .map(|m| (m.start, m.end)),
            );
        } else if n.starts_with("libc.so") {
            // Every version of each (pthread_cond_wait has two).
            let data = crate::process::maps::read_object(&l.host).unwrap_or_default();
            let mut f: Vec<(u64, u64, String)> = got::sized_exports(&data)
                .unwrap_or_default()
                .into_iter()
                .map(|(n, a, size)| (l.bias + a, size, n))
                .collect();
            f.sort();
            for (i, (a, size, name)) in f.iter().enumerate() {
                if ALLOCATOR.contains(&name.as_str()) || LOCKING.contains(&name.as_str()) {
                    let end = f[i + 1..].iter().map(|x| x.0).find(|e| e > a);
                    out.push((*a, end.unwrap_or(l.span.1)));
                } else if COND_WAITS.contains(&name.as_str()) {
                    // Its own bytes only: a wrong "let go" is the unsafe way.
                    released.push((*a, a + size));
                }
            }
        }
    }
    Locking {
        held: out,
        released,
    }
}

/// Every thread of `pid` held, with one to call in: held again after a
/// moment while every thread is inside the allocator or the loader (an
/// allocation-heavy loop), up to a limit.
pub(super) fn hold_calm(pid: u32, busy: &[(u64, u64)], locking: &Locking) -> Result<(Held, i32)> {
    const TRIES: u32 = 50;
    for _ in 0..TRIES {
        let held = Held::all(pid).map_err(|e| no(format!("cannot stop its threads: {e}")))?;
        if let Some(tid) = held.calm_thread(busy, locking) {
            return Ok((held, tid));
        }
        drop(held);
        std::thread::sleep(std::time::Duration::from_micros(500));
    }
    Err(no(format!(
        "every thread was inside its allocator or loader at {TRIES} stops"
    )))
}

impl Held {
    /// The thread to call in: one blocked in a system call other than a
    /// futex wait (it holds no user-space lock mid-update, as a thread
    /// stopped inside malloc would), else one stopped outside `busy` (the
    /// C library, the loader and the allocator: malloc and dlopen entered
    /// again mid-update corrupt the heap); None when every thread is in
    /// them (let it run a moment and hold it again).
    pub(super) fn calm_thread(&self, busy: &[(u64, u64)], locking: &Locking) -> Option<i32> {
        let syscall = |tid: i32| {
            let s = std::fs::read_to_string(format!("/proc/{}/task/{tid}/syscall", self.pid))
                .unwrap_or_default();
            let mut w = s.split_whitespace();
            let nr = w.next().and_then(|n| n.parse::<i64>().ok())?;
            let fd = w
                .next()
                .and_then(|a| i64::from_str_radix(a.trim_start_matches("0x"), 16).ok());
            Some((nr, fd.unwrap_or(-1)))
        };
        // Waiting for work, in a call neither the allocator nor the loader
        // makes with a lock held. The loader reads files with its lock
        // held: a read is idle only from a pipe, socket or terminal.
        let waits = |fd: i64| {
            std::fs::read_link(format!("/proc/{}/fd/{fd}", self.pid)).is_ok_and(|l| {
                let l = l.to_string_lossy();
                ["pipe:", "socket:", "/dev/pts/", "anon_inode:"]
                    .iter()
                    .any(|p| l.starts_with(p))
            })
        };
        // Each thread's call read once, and the maps once when a thread
        // waits on a futex.
        let calls: std::collections::HashMap<i32, Option<(i64, i64)>> =
            self.tids.iter().map(|&t| (t, syscall(t))).collect();
        let call = |tid: i32| calls.get(&tid).copied().flatten();
        let maps = std::cell::OnceCell::new();
        let idle = |tid: i32| {
            call(tid).is_some_and(|(n, fd)| {
                IDLE_CALLS.contains(&n) && (n != libc::SYS_read || waits(fd))
            })
        };
        let in_call = idle;
        // Waiting in the C library's futex call: in a condition variable's
        // wait (its innermost frames say so), its mutex let go, as an
        // allocator's background thread sleeps; else on a lock, which is
        // one the call takes only inside the allocator or the loader: a
        // return address into them on its stack tells (a word that only
        // looks like one keeps it out, never the other way).
        let waits_elsewhere = |tid: i32| {
            if call(tid).is_none_or(|(n, _)| n != libc::SYS_futex) {
                return false;
            }
            let maps = maps.get_or_init(|| crate::process::maps::read_maps(self.pid));
            let Some(words) = maps.as_deref().and_then(|m| self.stack_words(tid, m)) else {
                return false;
            };
            let into = |w: &[u64], ranges: &[(u64, u64)]| {
                w.iter()
                    .any(|v| ranges.iter().any(|r| (r.0..r.1).contains(v)))
            };
            into(
                &words[..words.len().min(COND_FRAMES / 8)],
                &locking.released,
            ) || !into(&words, &locking.held)
        };
        // Every thread, not only the one called in: one stopped inside
        // the allocator or the loader holds their locks, which the call
        // then waits on.
        let inside = |tid: i32| {
            !idle(tid)
                && self
                    .pc(tid)
                    .is_none_or(|pc| busy.iter().any(|r| (r.0..r.1).contains(&pc)))
                && !waits_elsewhere(tid)
        };
        if self.tids.iter().any(|&t| inside(t)) {
            return None;
        }
        let free = |&t: &i32| !self.pending.contains_key(&t);
        if let Some(t) = self.tids.iter().copied().filter(free).find(|&t| in_call(t)) {
            return Some(t);
        }
        self.tids.iter().copied().filter(free).find(|&t| {
            self.pc(t)
                .is_some_and(|pc| !busy.iter().any(|r| (r.0..r.1).contains(&pc)))
        })
    }

    /// The words of `tid`'s stack from its stack pointer up to the end of
    /// its stack's mapping (above it lie other data: struct pthread's list
    /// links into the loader's), at most `STACK_SCAN` bytes; None when they
    /// cannot be read.
    fn stack_words(&self, tid: i32, maps: &[crate::process::maps::Mapping]) -> Option<Vec<u64>> {
        let sp = crate::process::ptregs::sp(tid).ok()?;
        let stack = maps.iter().find(|m| m.start <= sp && sp < m.end)?;
        let mut buf = vec![0u8; STACK_SCAN.min((stack.end - sp) as usize)];
        let n = match self.mem.read_at(&mut buf, sp) {
            Ok(n) if n >= 8 => n,
            _ => return None,
        };
        Some(
            buf[..n]
                .chunks_exact(8)
                .map(|w| u64::from_ne_bytes(w.try_into().unwrap()))
                .collect(),
        )
    }
}

/// System calls a thread waits for work in (events, timers, children,
/// signals, a connection): neither glibc's allocator nor its loader makes
/// one with a lock held. A futex wait is not one (a lock's).
const IDLE_CALLS: &[i64] = &[
    #[cfg(target_arch = "x86_64")]
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_poll,
    libc::SYS_ppoll,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_select,
    libc::SYS_pselect6,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_wait4,
    libc::SYS_waitid,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_pause,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_rt_sigsuspend,
    libc::SYS_io_getevents,
    libc::SYS_io_uring_enter,
    libc::SYS_read,
];
/// How much of a futex waiter's stack is looked at for frames of the
/// allocator or the loader.
const STACK_SCAN: usize = 64 * 1024;
/// The innermost frames of a futex waiter, where a condition variable's
/// wait is looked for (the futex call's own frames are a few words).
const COND_FRAMES: usize = 1024;
