//! The bpf(2) calls memtrace makes itself, where aya 0.14 has no API: a
//! feature probe, and a program of an attach type aya cannot load (uprobe
//! sessions). One attribute layout and one wrapper for both.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

pub const BPF_PROG_LOAD: libc::c_long = 5;
pub const BPF_LINK_CREATE: libc::c_long = 28;
pub const BPF_BTF_LOAD: libc::c_long = 18;
pub const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// `BPF_BTF_LOAD`'s attribute prefix.
#[repr(C)]
#[derive(Default)]
pub struct BtfLoad {
    pub btf: u64,
    pub btf_log_buf: u64,
    pub btf_size: u32,
    pub btf_log_size: u32,
    pub btf_log_level: u32,
}

/// `BPF_PROG_LOAD`'s attribute prefix, up to `attach_prog_fd`
/// (include/uapi/linux/bpf.h); the kernel zero-extends the rest.
#[repr(C)]
#[derive(Default)]
pub struct ProgLoad {
    pub prog_type: u32,
    pub insn_cnt: u32,
    pub insns: u64,
    pub license: u64,
    pub log_level: u32,
    pub log_size: u32,
    pub log_buf: u64,
    pub kern_version: u32,
    pub prog_flags: u32,
    pub prog_name: [u8; 16],
    pub prog_ifindex: u32,
    pub expected_attach_type: u32,
    pub prog_btf_fd: u32,
    pub func_info_rec_size: u32,
    pub func_info: u64,
    pub func_info_cnt: u32,
    pub line_info_rec_size: u32,
    pub line_info: u64,
    pub line_info_cnt: u32,
    pub attach_btf_id: u32,
    pub attach_prog_fd: u32,
}

/// The attribute of the `BPF_MAP_*_ELEM` commands.
#[repr(C)]
pub struct ElemAttr {
    pub map_fd: u32,
    pub _pad: u32,
    pub key: u64,
    pub value: u64,
    pub flags: u64,
}

/// `union bpf_attr`'s `info` member (BPF_OBJ_GET_INFO_BY_FD).
#[repr(C)]
pub struct InfoAttr {
    pub bpf_fd: u32,
    pub info_len: u32,
    pub info: u64,
}

/// The kernel's `bpf_*_info` of the object behind `fd`: the fields this
/// kernel knows filled in, the rest zero (the size is `T`'s, so the kernel
/// never writes past it).
///
/// # Safety
/// `T` must be plain data valid for any bit pattern (a uapi info struct).
pub unsafe fn obj_info<T>(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<T> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain data by the caller's word; all-zero is a valid value.
    let mut info: T = unsafe { std::mem::zeroed() };
    let attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of::<T>() as u32,
        info: &mut info as *mut T as u64,
    };
    // SAFETY: attr points at a buffer of the size it claims.
    unsafe { call(BPF_OBJ_GET_INFO_BY_FD, &attr) }?;
    Ok(info)
}

/// bpf(2) with `attr`: what the kernel returned.
///
/// # Safety
/// Every pointer in `attr` must be valid for what `cmd` reads and writes
/// through it (for an element command: the map's key and value sizes).
unsafe fn raw<T>(cmd: libc::c_long, attr: &T) -> io::Result<i64> {
    // SAFETY: the caller vouches for the pointers; attr is `size_of::<T>()`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *const T,
            std::mem::size_of::<T>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// bpf(2) with `attr` for a command that returns 0 or an error.
///
/// # Safety
/// As `raw`.
pub unsafe fn call<T>(cmd: libc::c_long, attr: &T) -> io::Result<()> {
    // SAFETY: passed on from the caller.
    unsafe { raw(cmd, attr) }.map(|_| ())
}

/// bpf(2) with `attr` for a command that returns a new descriptor.
///
/// # Safety
/// As `raw`: the kernel reads (and for a load's log, writes) through the
/// pointers the caller put in `attr`.
pub unsafe fn call_fd<T>(cmd: libc::c_long, attr: &T) -> io::Result<OwnedFd> {
    // SAFETY: passed on from the caller.
    let r = unsafe { raw(cmd, attr) }?;
    // SAFETY: the syscall returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

pub const BPF_MAP_FREEZE: libc::c_long = 22;

/// `BPF_MAP_FREEZE`'s attribute: the map's descriptor.
#[repr(C)]
struct MapFd {
    map_fd: u32,
    _pad: u32,
}

/// Freezes a map: from now on no system call writes it and no process maps
/// it writable (the kernel programs still write it).
pub fn freeze(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let attr = MapFd {
        map_fd: fd.as_raw_fd() as u32,
        _pad: 0,
    };
    // SAFETY: BPF_MAP_FREEZE reads a map descriptor from the attribute.
    unsafe { call(BPF_MAP_FREEZE, &attr) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn attr_layout_matches_the_uapi() {
        // attach_btf_id sits at byte 108 of union bpf_attr for BPF_PROG_LOAD.
        assert_eq!(std::mem::offset_of!(super::ProgLoad, attach_btf_id), 108);
        assert_eq!(
            std::mem::offset_of!(super::ProgLoad, expected_attach_type),
            68
        );
    }
}
