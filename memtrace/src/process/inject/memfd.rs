//! The shim for a process in another mount namespace (a container): an
//! anonymous file the process itself creates (memfd_create, called in
//! it), which memtrace fills through a duplicate of its descriptor and
//! seals against any write before the process maps it by
//! `/proc/self/fd/N`. Nothing is written through the process's paths,
//! which it controls (a symlink there could point root's write at a host
//! file).

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

use rustix::fs::SealFlags;

use super::ptrace::{Held, DATA};
use super::{no, Result};

/// The process's copy: memtrace's descriptor of it (the probes attach
/// through it) and its identity.
pub struct Copy {
    pub fd: OwnedFd,
    pub id: (u64, u64),
    /// The descriptor number in the process (closed there once mapped).
    pub theirs: i32,
}

const SYS_MEMFD_CREATE: u64 = 319;
const MFD_CLOEXEC: u64 = 1;
const MFD_ALLOW_SEALING: u64 = 2;
/// Executable on kernels that ask (6.3+, `vm.memfd_noexec`); older ones
/// refuse the flag (EINVAL) and make every memfd executable.
const MFD_EXEC: u64 = 0x10;

/// `(dev, inode)` of an open file, as /proc/PID/maps numbers them.
pub fn identity(f: &impl std::os::fd::AsFd) -> std::io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(f)?;
    Ok((st.st_dev, st.st_ino))
}

/// Creates the copy in `pid` by calling `syscall` (glibc's) in thread
/// `tid`, and fills and seals it with `image`.
pub fn create(held: &mut Held, pid: u32, tid: i32, syscall: u64, image: &[u8]) -> Result<Copy> {
    let name = b"memtrace-preload-shim\0";
    let mut fd = -1i64;
    for flags in [
        MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_EXEC,
        MFD_CLOEXEC | MFD_ALLOW_SEALING,
    ] {
        fd = held
            .call(tid, syscall, &[SYS_MEMFD_CREATE, DATA, flags], name)
            .map_err(|e| no(format!("calling memfd_create in thread {tid}: {e}")))?
            as i64;
        if fd >= 0 {
            break;
        }
    }
    if fd < 0 {
        return Err(no(
            "it cannot create an executable memfd (vm.memfd_noexec?), and memtrace writes \
             nothing into another mount namespace's files",
        ));
    }
    let theirs = fd as i32;
    let ours = take_fd(pid, theirs).map_err(|e| no(format!("its memfd: {e}")))?;
    let file = File::from(ours);
    // What the process made: an empty file that can be sealed.
    let st = rustix::fs::fstat(&file).map_err(|e| no(format!("its memfd: {e}")))?;
    if st.st_size != 0 || rustix::fs::fcntl_get_seals(&file).is_err() {
        return Err(no("its memfd is not a new sealable file"));
    }
    file.write_all_at(image, 0)
        .map_err(|e| no(format!("writing the shim into its memfd: {e}")))?;
    rustix::fs::fcntl_add_seals(
        &file,
        SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
    )
    .map_err(|e| no(format!("sealing its memfd: {e}")))?;
    let fd = OwnedFd::from(file);
    let id = identity(&fd).map_err(|e| no(format!("its memfd: {e}")))?;
    Ok(Copy { fd, id, theirs })
}

/// A duplicate of descriptor `fd` of `pid` (pidfd_getfd, 5.6+; else the
/// reopened /proc link, the same anonymous file).
fn take_fd(pid: u32, fd: i32) -> std::io::Result<OwnedFd> {
    use rustix::process::{pidfd_getfd, pidfd_open, Pid, PidfdFlags, PidfdGetfdFlags};
    let p = Pid::from_raw(pid as i32).ok_or(std::io::ErrorKind::InvalidInput)?;
    if let Ok(pidfd) = pidfd_open(p, PidfdFlags::empty()) {
        if let Ok(f) = pidfd_getfd(&pidfd, fd, PidfdGetfdFlags::empty()) {
            return Ok(f);
        }
    }
    Ok(std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/fd/{fd}"))?
        .into())
}

impl Copy {
    /// The path memtrace attaches the shim's probes by (its own descriptor).
    pub fn path(&self) -> std::path::PathBuf {
        format!("/proc/self/fd/{}", self.fd.as_raw_fd()).into()
    }
}
