//! Hands the shim's memo (memtrace/preload/memo.c, memtrace-common's
//! `shim`) to the processes memleak traces: the slots the kernel program
//! publishes unwinds in, and the unwind tables' generation, both
//! memory-mapped BPF arrays. The shim asks at its start over a Unix
//! socket (an abstract address named in its environment, so nothing is
//! left on disk) and gets the two descriptors, which it maps read-only. A
//! process that memtrace did not start (not a descendant) gets nothing.
//!
//! Who gets them: a process of memtrace's own command tree whose user is
//! root (`SO_PEERCRED`, the peer pinned by a pidfd while its ancestry is
//! walked, so a pid taken over meanwhile is not believed). The slots hold
//! words of every traced process's stack: a process of another user gets
//! no memo (its allocations trap, still exact). The slots' map is frozen
//! before it is handed out, and the generation is a sealed page
//! (`ktables::genpage`): neither maps writable, so no process changes what
//! another reads.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};

/// The socket's abstract name for this run (in the shim's environment):
/// random, so that no one binds it first.
/// None without randomness (then no memo: a guessable name could be bound
/// first).
pub fn name() -> Option<String> {
    let r = super::safe_dir::random_hex().ok()?;
    Some(format!("memtrace-memo-{}-{r}", std::process::id()))
}

/// Serves `fds` (the slots, the generation) at `name` on a thread of its
/// own, for as long as memtrace runs. The slots' map is frozen first.
pub fn serve(name: &str, fds: [OwnedFd; 2]) -> io::Result<()> {
    crate::kernel::bpfsys::freeze(fds[0].as_fd())?;
    let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
    let listener = UnixListener::bind_addr(&addr)?;
    std::thread::Builder::new()
        .name("shim-memo".into())
        .spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                if allowed(&stream) {
                    let _ = send(&stream, &fds);
                }
            }
        })?;
    Ok(())
}

/// Whether the connecting process is root's and memtrace's descendant.
fn allowed(s: &UnixStream) -> bool {
    let Ok(cred) = rustix::net::sockopt::socket_peercred(s) else {
        return false;
    };
    if !cred.uid.is_root() {
        return false;
    }
    let pid = cred.pid.as_raw_nonzero().get() as u32;
    // Pinned: the pidfd names the peer's process even if it exits and its
    // number is reused while the walk reads /proc.
    let pinned = peer_pidfd(s).or_else(|| {
        rustix::process::pidfd_open(cred.pid, rustix::process::PidfdFlags::empty()).ok()
    });
    let Some(pidfd) = pinned else {
        return false;
    };
    pidfd_pid(&pidfd) == Some(pid) && ours(pid) && pidfd_pid(&pidfd) == Some(pid)
}

/// The peer's pidfd as the kernel took it at connect (SO_PEERPIDFD, 6.5+).
fn peer_pidfd(s: &UnixStream) -> Option<OwnedFd> {
    const SO_PEERPIDFD: libc::c_int = 77;
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: an int-sized buffer and its length.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    // SAFETY: a descriptor the kernel just made for this process.
    (r == 0 && fd >= 0).then(|| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// The pid a pidfd names in this namespace; None once it exited.
fn pidfd_pid(fd: &OwnedFd) -> Option<u32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    let pid: i64 = info
        .lines()
        .find_map(|l| l.strip_prefix("Pid:"))?
        .trim()
        .parse()
        .ok()?;
    (pid > 0).then_some(pid as u32)
}

/// Whether `pid` descends from memtrace (its `-c` command's tree).
fn ours(pid: u32) -> bool {
    let me = std::process::id();
    let mut p = pid;
    for _ in 0..64 {
        match crate::process::proc::parent_of(p) {
            Some(q) if q == me => return true,
            Some(q) if q > 1 => p = q,
            _ => return false,
        }
    }
    false
}

/// One byte with the descriptors.
fn send(s: &UnixStream, fds: &[OwnedFd; 2]) -> io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let borrowed = [fds[0].as_fd(), fds[1].as_fd()];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&borrowed)) {
        return Err(io::Error::other("no room for the descriptors"));
    }
    let n = rustix::net::sendmsg(
        s,
        &[io::IoSlice::new(&[1])],
        &mut control,
        SendFlags::empty(),
    )?;
    if n != 1 {
        return Err(io::Error::other("short send"));
    }
    Ok(())
}
