//! The unwind tables' generation as the shim reads it: a page of a sealed
//! memfd that memtrace maps writable once and then seals against any
//! other writer (`F_SEAL_FUTURE_WRITE`), so the descriptor handed to
//! traced processes maps read-only, and nothing they do changes what
//! another process reads. (The BPF array the kernel programs read cannot
//! be handed out so: a frozen map is written by no system call, and a
//! read-only map descriptor cannot be mapped.)

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::fs::{MemfdFlags, SealFlags};

pub struct GenPage {
    fd: OwnedFd,
    word: *mut AtomicU32,
    len: usize,
}

// SAFETY: the page is only written through the atomic word.
unsafe impl Send for GenPage {}

impl GenPage {
    pub fn new(gen: u32) -> std::io::Result<GenPage> {
        let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        let fd = rustix::fs::memfd_create("memtrace-unwind-gen", flags | MemfdFlags::NOEXEC_SEAL)
            .or_else(|_| rustix::fs::memfd_create("memtrace-unwind-gen", flags))?;
        let len = crate::kernel::btf::page_size() as usize;
        rustix::fs::ftruncate(&fd, len as u64)?;
        // SAFETY: a new shared mapping of a file of `len` bytes, unmapped
        // only in Drop; nothing else aliases it in this process.
        let at = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &fd,
                0,
            )
        }?;
        let page = GenPage {
            fd,
            word: at.cast(),
            len,
        };
        page.set(gen);
        rustix::fs::fcntl_add_seals(
            &page.fd,
            SealFlags::SHRINK | SealFlags::GROW | SealFlags::FUTURE_WRITE | SealFlags::SEAL,
        )?;
        Ok(page)
    }

    pub fn set(&self, gen: u32) {
        // SAFETY: `word` is the start of the live mapping (page-aligned).
        unsafe { &*self.word }.store(gen, Ordering::Release);
    }

    /// A descriptor that maps read-only (the seal refuses a writable one).
    pub fn fd(&self) -> Option<OwnedFd> {
        self.fd.try_clone().ok()
    }
}

impl Drop for GenPage {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new, not used after this.
        let _ = unsafe { rustix::mm::munmap(self.word.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_handed_out_maps_read_only_and_shows_each_generation() {
        let g = GenPage::new(7).unwrap();
        let fd = g.fd().unwrap();
        let len = crate::kernel::btf::page_size() as usize;
        let rw = rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE;
        let shared = rustix::mm::MapFlags::SHARED;
        // SAFETY: mappings made and dropped here; the writable one must fail.
        let w = unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, rw, shared, &fd, 0) };
        assert_eq!(w.err(), Some(rustix::io::Errno::PERM));
        let r = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ,
                shared,
                &fd,
                0,
            )
        }
        .unwrap();
        let read = || unsafe { std::ptr::read_volatile(r.cast::<u32>()) };
        assert_eq!(read(), 7);
        g.set(8);
        assert_eq!(read(), 8);
        // No upgrade to writable afterwards either.
        assert!(unsafe { rustix::mm::mprotect(r, len, rustix::mm::MprotectFlags::WRITE) }.is_err());
        unsafe { rustix::mm::munmap(r, len) }.unwrap();
    }
}
