//! Waiting out the BPF programs running now. Updating an array-of-maps
//! slot makes the kernel wait an RCU grace period before returning
//! (`maybe_wait_bpf_programs` in kernel/bpf/syscall.c; the kernel's own
//! selftests use it the same way), and every tracing program runs inside
//! an RCU read section: once the update returns, no program that started
//! before it is still running.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use super::bpfsys;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_MAP_TYPE_ARRAY_OF_MAPS: u32 = 12;

/// `BPF_MAP_CREATE`'s attribute prefix, up to `inner_map_fd`.
#[repr(C)]
#[derive(Default)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
}

/// A one-slot array of maps, and the map its slot is set to.
pub struct GracePeriod {
    outer: OwnedFd,
    inner: OwnedFd,
}

impl GracePeriod {
    pub fn new() -> io::Result<Self> {
        let array = |map_type, value_size, inner_map_fd| MapCreate {
            map_type,
            key_size: 4,
            value_size,
            max_entries: 1,
            inner_map_fd,
            ..Default::default()
        };
        // SAFETY: BPF_MAP_CREATE's attribute holds no pointers.
        let inner = unsafe { bpfsys::call_fd(BPF_MAP_CREATE, &array(BPF_MAP_TYPE_ARRAY, 4, 0)) }?;
        // SAFETY: as above.
        let outer = unsafe {
            bpfsys::call_fd(
                BPF_MAP_CREATE,
                &array(BPF_MAP_TYPE_ARRAY_OF_MAPS, 4, inner.as_raw_fd() as u32),
            )
        }?;
        Ok(GracePeriod { outer, inner })
    }

    /// Returns once every BPF program running when it was called has ended.
    pub fn wait(&self) -> io::Result<()> {
        let key = 0u32;
        let fd = self.inner.as_raw_fd() as u32;
        let attr = bpfsys::ElemAttr {
            map_fd: self.outer.as_raw_fd() as u32,
            _pad: 0,
            key: &key as *const u32 as u64,
            value: &fd as *const u32 as u64,
            flags: 0,
        };
        // SAFETY: key and value point at 4-byte locals, the sizes the outer
        // map was created with, alive for the call.
        unsafe { bpfsys::call(BPF_MAP_UPDATE_ELEM, &attr) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_returns_and_can_be_repeated() {
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to create BPF maps");
            return;
        }
        let g = GracePeriod::new().expect("array of maps");
        for _ in 0..3 {
            g.wait().expect("update");
        }
    }
}
