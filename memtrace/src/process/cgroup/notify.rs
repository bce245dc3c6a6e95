//! Being told by the kernel, not polling: the v1 usage threshold notifier
//! (an eventfd armed through cgroup.event_control), v2 memory.events
//! changes and PSI triggers (both signal POLLPRI), and a timer, gathered in
//! one epoll descriptor the event loop waits on.
//!
//! A PSI trigger cannot sit in that epoll: its poll takes the event (it
//! resets the trigger's flag), and a nested epoll polls each ready source
//! twice, once when the outer loop asks whether this descriptor is ready
//! and again when `ready` collects the events, so the second poll finds
//! nothing and the event is lost. Each trigger is watched by a thread of
//! its own, which polls it alone and signals an eventfd in the epoll.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

enum Source {
    /// An eventfd or a timerfd: 8 bytes to read once it fires. The v1
    /// notifier's usage file stays open for as long as the eventfd.
    Counter { fd: File, _usage: Option<File> },
    /// A cgroup file that signals a change with POLLPRI until it is read again.
    Kernfs(File),
    /// A PSI trigger's eventfd, written by the thread that watches it.
    Psi { fd: File, _watch: PsiWatch },
    /// Any other readable fd (a listening socket): its owner reads it.
    Readable { _own: std::os::fd::OwnedFd },
}

/// The thread that polls one PSI trigger; stopped and joined on drop, which
/// closes the trigger (and so removes it).
struct PsiWatch {
    stop: File,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for PsiWatch {
    fn drop(&mut self) {
        let _ = (&self.stop).write_all(&1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn eventfd() -> std::io::Result<File> {
    // SAFETY: plain syscall; the fd is owned by the File.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Polls `trigger` until `stop` is written, writing `signal` at each event.
/// A trigger gone (its group removed) reports POLLERR: the watch ends.
fn watch_psi(trigger: File, signal: File, stop: File) {
    let mut fds = [
        libc::pollfd {
            fd: trigger.as_raw_fd(),
            events: libc::POLLPRI,
            revents: 0,
        },
        libc::pollfd {
            fd: stop.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: fds holds two valid pollfd for open descriptors.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if fds[1].revents != 0 || fds[0].revents & (libc::POLLERR | libc::POLLNVAL) != 0 {
            return;
        }
        if fds[0].revents & libc::POLLPRI != 0 {
            let _ = (&signal).write_all(&1u64.to_ne_bytes());
        }
    }
}

/// The trigger line for tasks stalled `pct` percent of a window: 1 s, or
/// 2 s without CAP_SYS_RESOURCE (the only windows the kernel then takes:
/// multiples of 2 s).
pub fn psi_line(kind: &str, pct: f64, privileged: bool) -> String {
    let window_us: u64 = if privileged { 1_000_000 } else { 2_000_000 };
    let stall_us = ((pct / 100.0) * window_us as f64).max(1.0) as u64;
    format!("{kind} {stall_us} {window_us}")
}

/// Several kernel notifiers behind one descriptor; each tagged by its owner.
pub struct Poller {
    ep: OwnedFd,
    sources: Vec<(Source, u64)>,
}

fn cvt(r: libc::c_int) -> std::io::Result<libc::c_int> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl Poller {
    pub fn new() -> std::io::Result<Poller> {
        // SAFETY: plain syscall; the fd is owned below.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        Ok(Poller {
            ep: unsafe { OwnedFd::from_raw_fd(fd) },
            sources: Vec::new(),
        })
    }

    /// Readable when any source has fired.
    pub fn fd(&self) -> RawFd {
        self.ep.as_raw_fd()
    }

    fn add(&mut self, fd: RawFd, events: u32, src: Source, tag: u64) -> std::io::Result<()> {
        let mut ev = libc::epoll_event {
            events,
            u64: self.sources.len() as u64,
        };
        // SAFETY: ev is a valid epoll_event; fd is open (owned by src).
        cvt(unsafe { libc::epoll_ctl(self.ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) })?;
        self.sources.push((src, tag));
        Ok(())
    }

    /// A timer firing every `every`.
    pub fn timer(&mut self, every: Duration, tag: u64) -> std::io::Result<()> {
        // SAFETY: plain syscalls on an fd owned by the File.
        let fd = cvt(unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        })?;
        let f = unsafe { File::from_raw_fd(fd) };
        let ts = libc::timespec {
            tv_sec: every.as_secs() as libc::time_t,
            tv_nsec: every.subsec_nanos() as libc::c_long,
        };
        let spec = libc::itimerspec {
            it_interval: ts,
            it_value: ts,
        };
        cvt(unsafe { libc::timerfd_settime(fd, 0, &spec, std::ptr::null_mut()) })?;
        self.add(
            fd,
            libc::EPOLLIN as u32,
            Source::Counter {
                fd: f,
                _usage: None,
            },
            tag,
        )
    }

    /// v1: fires when the group's usage crosses `bytes`, either way.
    pub fn v1_threshold(&mut self, dir: &Path, bytes: u64, tag: u64) -> std::io::Result<()> {
        let usage = File::open(dir.join("memory.usage_in_bytes"))?;
        // SAFETY: plain syscall; the fd is owned by the File.
        let efd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        let ev = unsafe { File::from_raw_fd(efd) };
        let line = format!("{} {} {bytes}", efd, usage.as_raw_fd());
        OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.event_control"))?
            .write_all(line.as_bytes())?;
        self.add(
            efd,
            libc::EPOLLIN as u32,
            Source::Counter {
                fd: ev,
                _usage: Some(usage),
            },
            tag,
        )
    }

    /// v2: fires when memory.events changes (high, max, oom, oom_kill).
    pub fn v2_events(&mut self, dir: &Path, tag: u64) -> std::io::Result<()> {
        let mut f = File::open(dir.join("memory.events"))?;
        // Read once: a change is signalled relative to the last read.
        let _ = f.read_to_end(&mut Vec::new());
        let fd = f.as_raw_fd();
        self.add(fd, libc::EPOLLPRI as u32, Source::Kernfs(f), tag)
    }

    /// A PSI trigger on the group's memory.pressure: fires when tasks
    /// stalled (`some` or `full`) `pct` percent of a window (`psi_line`).
    pub fn psi_trigger(
        &mut self,
        dir: &Path,
        kind: &str,
        pct: f64,
        tag: u64,
    ) -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(dir.join("memory.pressure"))?;
        let line = psi_line(kind, pct, crate::kernel::caps::sys_resource());
        // The trigger string with its NUL, as the kernel documents it.
        f.write_all(format!("{line}\0").as_bytes())?;
        let (signal, stop) = (eventfd()?, eventfd()?);
        let (w_signal, w_stop) = (signal.try_clone()?, stop.try_clone()?);
        let thread = std::thread::Builder::new()
            .name("psi-trigger".into())
            .spawn(move || watch_psi(f, w_signal, w_stop))?;
        let fd = signal.as_raw_fd();
        let watch = PsiWatch {
            stop,
            thread: Some(thread),
        };
        self.add(
            fd,
            libc::EPOLLIN as u32,
            Source::Psi {
                fd: signal,
                _watch: watch,
            },
            tag,
        )
    }

    /// `fd` readable (a copy is kept: the caller reads its own).
    pub fn readable(&mut self, fd: std::os::fd::BorrowedFd, tag: u64) -> std::io::Result<()> {
        let own = fd.try_clone_to_owned()?;
        let raw = own.as_raw_fd();
        self.add(
            raw,
            libc::EPOLLIN as u32,
            Source::Readable { _own: own },
            tag,
        )
    }

    /// The tags of the sources that fired, each re-armed.
    pub fn ready(&mut self) -> Vec<u64> {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 32];
        // SAFETY: evs has room for the 32 events asked for.
        let n = unsafe { libc::epoll_wait(self.ep.as_raw_fd(), evs.as_mut_ptr(), 32, 0) };
        let mut out = Vec::new();
        for ev in evs.iter().take(n.max(0) as usize) {
            let Some((src, tag)) = self.sources.get_mut(ev.u64 as usize) else {
                continue;
            };
            match src {
                Source::Counter { fd, .. } | Source::Psi { fd, .. } => {
                    let _ = fd.read(&mut [0u8; 8]);
                }
                Source::Kernfs(f) => {
                    let _ = f.rewind();
                    let _ = f.read_to_end(&mut Vec::new());
                }
                Source::Readable { .. } => {}
            }
            out.push(*tag);
        }
        out
    }
}
