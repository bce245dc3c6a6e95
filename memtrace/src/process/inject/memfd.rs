//! The shim for a process in another mount namespace (a container): an
//! anonymous file the process itself creates (memfd_create, called in
//! it), which memtrace fills through a duplicate of its descriptor and
//! seals against any write before the process maps it by
//! `/proc/self/fd/N`. Nothing is written through the process's paths,
//! which it controls (a symlink there could point root's write at a host
//! file).

use std::fs::File;
use std::os::fd::OwnedFd;
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

const SYS_MEMFD_CREATE: u64 = libc::SYS_memfd_create as u64;
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
    let file = File::from(take_fd(pid, theirs).map_err(|e| no(format!("its memfd: {e}")))?);
    // What the process made, not what another process sharing its
    // descriptors (CLONE_FILES) put at that number meanwhile: a new
    // anonymous file of that name, never sealed, empty, open read-write.
    let fresh = || -> std::io::Result<bool> {
        let st = rustix::fs::fstat(&file)?;
        let link = std::fs::read_link(crate::process::maps::fd_path(&file))?;
        let mode = rustix::fs::fcntl_getfl(&file)?;
        Ok(
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile
                && st.st_nlink == 0
                && st.st_size == 0
                && rustix::fs::fcntl_get_seals(&file)? == SealFlags::empty()
                && mode & rustix::fs::OFlags::RWMODE == rustix::fs::OFlags::RDWR
                && link.as_os_str() == "/memfd:memtrace-preload-shim (deleted)",
        )
    };
    if !fresh().unwrap_or(false) {
        return Err(no("its descriptor is not the memfd it made"));
    }
    file.write_all_at(image, 0)
        .map_err(|e| no(format!("writing the shim into its memfd: {e}")))?;
    let all = SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL;
    rustix::fs::fcntl_add_seals(&file, all).map_err(|e| no(format!("sealing its memfd: {e}")))?;
    // Sealed as written: no other writer came between.
    let mut back = vec![0u8; image.len()];
    let same = rustix::fs::fcntl_get_seals(&file).is_ok_and(|s| s.contains(all))
        && rustix::fs::fstat(&file).is_ok_and(|st| st.st_size as usize == image.len())
        && file.read_exact_at(&mut back, 0).is_ok()
        && back == image;
    if !same {
        return Err(no("its memfd changed while memtrace wrote it"));
    }
    let fd = OwnedFd::from(file);
    let id = identity(&fd).map_err(|e| no(format!("its memfd: {e}")))?;
    Ok(Copy { fd, id, theirs })
}

/// A duplicate of descriptor `fd` of `pid` (pidfd_getfd, 5.6+): never a
/// reopening of its /proc link, which would run a driver's open on
/// whatever another process put at that number.
fn take_fd(pid: u32, fd: i32) -> std::io::Result<OwnedFd> {
    use rustix::process::{pidfd_getfd, pidfd_open, Pid, PidfdFlags, PidfdGetfdFlags};
    let p = Pid::from_raw(pid as i32).ok_or(std::io::ErrorKind::InvalidInput)?;
    let pidfd = pidfd_open(p, PidfdFlags::empty())?;
    Ok(pidfd_getfd(&pidfd, fd, PidfdGetfdFlags::empty())?)
}

impl Copy {
    /// The path memtrace attaches the shim's probes by (its own descriptor).
    pub fn path(&self) -> std::path::PathBuf {
        crate::process::maps::fd_path(&self.fd)
    }
}
