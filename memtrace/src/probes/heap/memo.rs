//! Hands the shim's memo (memtrace/preload/memo.c, memtrace-common's
//! `shim`) to the processes memleak traces: the slots the kernel program
//! publishes unwinds in, and the unwind tables' generation, both
//! memory-mapped BPF arrays. The shim asks at its start over a Unix
//! socket (an abstract address named in its environment, so nothing is
//! left on disk) and gets the two descriptors, which it maps read-only. A
//! process that memtrace did not start (not a descendant) gets nothing.
//!
//! Hand-written: passing descriptors (SCM_RIGHTS) and reading the peer's
//! credentials are two libc calls, which std does not have on stable.

use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};

/// The socket's abstract name for this run (in the shim's environment).
pub fn name() -> String {
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("memtrace-memo-{}-{nonce:x}", std::process::id())
}

/// Serves `fds` (the slots, the generation) at `name` on a thread of its
/// own, for as long as memtrace runs. The descriptors can write (this
/// kernel refuses to map a read-only one): a process of the command's own
/// tree could change what the others read, as it could anything of theirs.
pub fn serve(name: &str, fds: [OwnedFd; 2]) -> io::Result<()> {
    let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
    let listener = UnixListener::bind_addr(&addr)?;
    std::thread::Builder::new()
        .name("shim-memo".into())
        .spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                if peer(&stream).is_some_and(ours) {
                    let _ = send(&stream, &fds);
                }
            }
        })?;
    Ok(())
}

/// The connecting process.
fn peer(s: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a ucred-sized buffer and its length.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0 && cred.pid > 0).then_some(cred.pid as u32)
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
fn send(mut s: &UnixStream, fds: &[OwnedFd; 2]) -> io::Result<()> {
    let raw = [fds[0].as_raw_fd(), fds[1].as_raw_fd()];
    let mut byte = [1u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE of two descriptors, computed by libc.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(&raw) as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: a zeroed msghdr is valid; its buffers outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer holds one header and the descriptors.
    unsafe {
        let h = libc::CMSG_FIRSTHDR(&msg);
        (*h).cmsg_level = libc::SOL_SOCKET;
        (*h).cmsg_type = libc::SCM_RIGHTS;
        (*h).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(&raw) as u32) as _;
        std::ptr::copy_nonoverlapping(raw.as_ptr(), libc::CMSG_DATA(h).cast(), 2);
    }
    // SAFETY: a connected socket and a complete msghdr.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, 0) };
    if n != 1 {
        return Err(io::Error::last_os_error());
    }
    s.flush()
}
