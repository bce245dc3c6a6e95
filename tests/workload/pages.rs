//! Pages read, touched and faulted from files, each from a function of its
//! own (tests look for these names in stacks).

use std::hint::black_box;

use crate::{map_anon, PAGE};

#[inline(never)]
pub fn read_zero_pages(n: usize) {
    let p = map_anon(n * PAGE);
    let mut sum = 0u64;
    for i in 0..n {
        sum += unsafe { std::ptr::read_volatile(p.add(i * PAGE)) } as u64;
    }
    black_box(sum);
    unsafe { libc::munmap(p as *mut libc::c_void, n * PAGE) };
}

#[inline(never)]
pub fn allocate_and_touch_mib(mib: usize) {
    let len = mib << 20;
    let p = map_anon(len);
    for i in (0..len).step_by(PAGE) {
        unsafe { std::ptr::write_volatile(p.add(i), 1) };
    }
}

#[inline(never)]
pub fn read_file_pages(path: &str, k: usize) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).expect("open");
    let len = f.metadata().unwrap().len() as usize;
    assert!(len >= k * PAGE, "file too small");
    // Drop this file's pages from the page cache (written back first, or dirty
    // pages stay) so every read faults to disk.
    unsafe { libc::fsync(f.as_raw_fd()) };
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
            0,
        )
    };
    assert!(p != libc::MAP_FAILED);
    // No readahead: one fault per page read.
    unsafe { libc::madvise(p, len, libc::MADV_RANDOM) };
    let p = p as *const u8;
    let mut sum = 0u64;
    for i in 0..k {
        sum += unsafe { std::ptr::read_volatile(p.add(i * PAGE)) } as u64;
    }
    black_box(sum);
}
