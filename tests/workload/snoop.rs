//! `maps` and `shm`: memory-mapping and System V shared-memory calls with
//! known arguments, each printed as made, for the snoop tools' tests.

use crate::PAGE;

/// Sizes (pages) and protections of the regions `maps` creates: distinct,
/// so a tracer's lines can be matched to them.
const MAP_REGIONS: [(usize, i32); 4] = [
    (1, libc::PROT_READ),
    (2, libc::PROT_READ | libc::PROT_WRITE),
    (3, libc::PROT_NONE),
    (5, libc::PROT_READ | libc::PROT_EXEC),
];

/// mmap(2) issued from this function itself, so a frame-pointer stack starts
/// here. Returns the raw result (an address or -errno).
#[inline(never)]
fn mmap_raw(len: usize, prot: i32, flags: i32) -> i64 {
    // A fresh anonymous mapping or an error; nothing is overwritten.
    let a = [0, len as u64, prot as u64, flags as u64, u64::MAX, 0];
    crate::raw::syscall6(libc::SYS_mmap, a)
}

/// maps [FILE]: map the regions of MAP_REGIONS (anonymous, private, the last
/// also NORESERVE), grow the second with mremap, map FILE shared read-only if
/// given, unmap them all, then two mmaps that fail: length 0 (EINVAL) and
/// 2^48 bytes, more than a process's address space (ENOMEM whatever the
/// overcommit policy). Prints
/// one line per call: `mmap ADDR LEN`, `mremap OLD NEW NEWLEN`, `file ADDR LEN`,
/// `munmap ADDR LEN`, `fail LEN RET`.
pub fn maps(file: Option<&str>) {
    use std::os::fd::AsRawFd;
    let mut regions = Vec::new();
    for (i, (pages, prot)) in MAP_REGIONS.iter().enumerate() {
        let len = pages * PAGE;
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        if i == MAP_REGIONS.len() - 1 {
            flags |= libc::MAP_NORESERVE;
        }
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, *prot, flags, -1, 0) };
        assert!(p != libc::MAP_FAILED, "mmap failed");
        println!("mmap {:#x} {len}", p as u64);
        regions.push((p, len));
    }
    // Grow region 1 (2 pages, RW) to 7 pages; it may move.
    let (old, old_len) = regions[1];
    let new_len = 7 * PAGE;
    let p = unsafe { libc::mremap(old, old_len, new_len, libc::MREMAP_MAYMOVE) };
    assert!(p != libc::MAP_FAILED, "mremap failed");
    println!("mremap {:#x} {:#x} {new_len}", old as u64, p as u64);
    regions[1] = (p, new_len);
    if let Some(path) = file {
        let f = std::fs::File::open(path).expect("open");
        let len = f.metadata().unwrap().len() as usize;
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert!(p != libc::MAP_FAILED, "mmap of {path} failed");
        println!("file {:#x} {len} {}", p as u64, f.as_raw_fd());
        // Open and mapped a while: the tracer names the file from the fd.
        std::thread::sleep(std::time::Duration::from_millis(300));
        regions.push((p, len));
    }
    for (p, len) in regions {
        assert_eq!(unsafe { libc::munmap(p, len) }, 0);
        println!("munmap {:#x} {len}", p as u64);
    }
    let ret = mmap_raw(0, libc::PROT_READ, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
    println!("fail 0 {ret}");
    let huge = 1usize << 48;
    let ret = mmap_raw(
        huge,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
    );
    println!("fail {huge} {ret}");
}

/// shm: shmget, shmat, shmdt and shmctl(IPC_RMID) once each; prints
/// `shmid ID` and `shmat ADDR`.
pub fn shm() {
    let id = unsafe { libc::shmget(libc::IPC_PRIVATE, 16 * PAGE, libc::IPC_CREAT | 0o600) };
    assert!(id >= 0, "shmget failed");
    println!("shmid {id}");
    let p = unsafe { libc::shmat(id, std::ptr::null(), 0) };
    assert!(p as isize != -1, "shmat failed");
    println!("shmat {:#x}", p as u64);
    assert_eq!(unsafe { libc::shmdt(p) }, 0);
    assert_eq!(
        unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) },
        0
    );
}

/// madvise(MADV_NORMAL) N times over LEN bytes, each followed by one over
/// LEN2 when that is not 0 (count/trace tests).
pub(crate) fn advise(n: usize, len: usize, len2: usize) {
    let size = len.max(len2);
    // SAFETY: a fresh anonymous mapping, advised and unmapped here only.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        for _ in 0..n {
            assert_eq!(libc::madvise(p, len, libc::MADV_NORMAL), 0);
            if len2 > 0 {
                assert_eq!(libc::madvise(p, len2, libc::MADV_NORMAL), 0);
            }
        }
        libc::munmap(p, size);
    }
}
