//! Tracepoint links that carry a BPF cookie. `count` and `trace` serve
//! every tracepoint with one program, which must learn which one fired:
//! the record's `common_type` is not filled in yet when a BPF program runs
//! (perf fills the common fields after), so the cookie is the only way. aya
//! 0.14 attaches tracepoints without a cookie (`TracePoint::attach` passes
//! none), so this opens the perf event and creates the link itself, as
//! libbpf does: two syscalls. Cookies on perf links need Linux 5.15.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::why::WayError;
use crate::kernel::{bpfsys, tracefs};

const PERF_TYPE_TRACEPOINT: u32 = 2;
/// `PERF_ATTR_SIZE_VER5`: every field past it is left zero, which the
/// kernel accepts from any later size.
const PERF_ATTR_SIZE: u32 = 112;
const BPF_PERF_EVENT: u32 = 41;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

/// `union bpf_attr`'s `link_create` with `perf_event.bpf_cookie`.
#[repr(C)]
#[derive(Default)]
struct LinkCreate {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    bpf_cookie: u64,
}

fn event_id(cat: &str, name: &str) -> Result<u64, WayError> {
    let root = tracefs::root().map_err(|e| WayError::Unavailable(e.to_string()))?;
    let path = root.join("events").join(cat).join(name).join("id");
    std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| {
            WayError::Unavailable(format!(
                "no tracepoint {cat}:{name} ({} unreadable)",
                path.display()
            ))
        })
}

fn fd(ret: libc::c_long, what: &str) -> Result<OwnedFd, WayError> {
    if ret < 0 {
        return Err(WayError::Failed(format!(
            "{what}: {}",
            io::Error::last_os_error()
        )));
    }
    // SAFETY: the syscall returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as i32) })
}

/// Attaches the loaded tracepoint program `prog` to `cat:name` with
/// `cookie`; the returned descriptors hold the attachment.
pub fn attach_tracepoint(
    prog: BorrowedFd<'_>,
    cat: &str,
    name: &str,
    cookie: u64,
) -> Result<[OwnedFd; 2], WayError> {
    let id = event_id(cat, name)?;
    // perf_event_attr: type, size, config; the rest zero.
    let mut attr = [0u8; PERF_ATTR_SIZE as usize];
    attr[0..4].copy_from_slice(&PERF_TYPE_TRACEPOINT.to_ne_bytes());
    attr[4..8].copy_from_slice(&PERF_ATTR_SIZE.to_ne_bytes());
    attr[8..16].copy_from_slice(&id.to_ne_bytes());
    // pid -1, cpu 0: a tracepoint's programs run on every CPU whatever the
    // event's CPU is.
    // SAFETY: attr is a valid perf_event_attr of the size it claims.
    let perf = fd(
        unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                attr.as_ptr(),
                -1,
                0,
                -1,
                PERF_FLAG_FD_CLOEXEC,
            )
        },
        "perf_event_open",
    )?;
    let la = LinkCreate {
        prog_fd: prog.as_raw_fd() as u32,
        target_fd: perf.as_raw_fd() as u32,
        attach_type: BPF_PERF_EVENT,
        flags: 0,
        bpf_cookie: cookie,
    };
    // SAFETY: la holds no pointers.
    let link = unsafe { bpfsys::call_fd(bpfsys::BPF_LINK_CREATE, &la) }.map_err(|e| {
        WayError::Failed(format!(
            "BPF_LINK_CREATE with a cookie (needs Linux 5.15): {e}"
        ))
    })?;
    Ok([link, perf])
}
