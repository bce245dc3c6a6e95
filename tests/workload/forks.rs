//! Forked children: one that allocates, one that moves the break, several
//! holding memory at once, and many one after another (churn).

use crate::brk::grow_heap_with_sbrk;
use crate::pages;

pub(crate) fn wait(pid: libc::pid_t) {
    let mut st = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
}

/// A child touches `mib` MiB and exits a second later; the parent lingers
/// `linger_ms` after it.
pub(crate) fn alloc(mib: usize, linger_ms: u64) {
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        pages::allocate_and_touch_mib(mib);
        std::thread::sleep(std::time::Duration::from_millis(1000));
        unsafe { libc::_exit(0) };
    }
    wait(pid);
    std::thread::sleep(std::time::Duration::from_millis(linger_ms));
}

/// A child calls sbrk `n` times; the parent none.
pub(crate) fn sbrk(n: usize) {
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        grow_heap_with_sbrk(n, 4096);
        unsafe { libc::_exit(0) };
    }
    wait(pid);
}

/// `n` children each touch `mib` MiB and hold it; once all have, "ready"
/// is printed; they all exit after `hold_ms`.
pub(crate) fn hold(n: usize, mib: usize, hold_ms: u64) {
    let mut fds = [0i32; 2];
    unsafe { libc::pipe(fds.as_mut_ptr()) };
    let mut pids = Vec::new();
    for _ in 0..n {
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            pages::allocate_and_touch_mib(mib);
            unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) };
            std::thread::sleep(std::time::Duration::from_millis(hold_ms));
            unsafe { libc::_exit(0) };
        }
        pids.push(pid);
    }
    let mut b = [0u8; 1];
    for _ in 0..n {
        unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) };
    }
    println!("ready");
    for pid in pids {
        wait(pid);
    }
}

/// N children forked one after another, each running `f` and exiting.
pub(crate) fn one_after_another(n: usize, f: impl Fn()) {
    for _ in 0..n {
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            f();
            unsafe { libc::_exit(0) };
        }
        wait(pid);
    }
}

/// A chain of `depth` + 1 processes, each forked by the one before it
/// after that one ran the allocator (1,000 malloc/free pairs) and kept
/// `k` blocks of `size` (`leak_small_blocks`). The last prints "ready";
/// it holds `hold_ms`, then each exits after its child.
pub(crate) fn chain(depth: usize, k: usize, size: usize, hold_ms: u64) {
    for d in 0..=depth {
        crate::leak::malloc_loop(1000);
        crate::leak::leak_small_blocks(k, size);
        if d == depth {
            break;
        }
        let pid = unsafe { libc::fork() };
        if pid != 0 {
            wait(pid);
            return;
        }
    }
    println!("ready");
    std::thread::sleep(std::time::Duration::from_millis(hold_ms));
}

/// The parent maps `n` files of `dir` (made here, out of the page cache)
/// without touching them; then one child after another reads one page of
/// one file and exits at once (a server's short-lived workers).
pub(crate) fn fault_files(n: usize, dir: &str) {
    use std::os::fd::AsRawFd;
    let mut maps = Vec::new();
    for i in 0..n {
        let path = format!("{dir}/file-{i}");
        std::fs::write(&path, [7u8; 4096]).expect("write");
        let f = std::fs::File::open(&path).expect("open");
        // SAFETY: calls on an open descriptor; the mapping is read only.
        unsafe {
            libc::fsync(f.as_raw_fd());
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
            let p = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            );
            assert!(p != libc::MAP_FAILED);
            maps.push(p as *const u8);
        }
    }
    for p in maps {
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: a page of a mapping made above.
            std::hint::black_box(unsafe { std::ptr::read_volatile(p) });
            unsafe { libc::_exit(0) };
        }
        wait(pid);
    }
}
