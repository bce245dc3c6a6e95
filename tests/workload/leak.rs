//! Allocation patterns with known outcomes, for memleak.

use std::hint::black_box;
use std::time::Duration;

/// K blocks of SIZE bytes, never freed.
#[inline(never)]
pub fn leak_small_blocks(k: usize, size: usize) {
    for _ in 0..k {
        black_box(unsafe { libc::malloc(size) });
    }
}

/// M blocks of SIZE bytes (above glibc's mmap threshold: each its own
/// mapping), never freed. (Each body differs from the others': identical
/// functions would be folded into one by the linker.)
#[inline(never)]
pub fn leak_big_blocks(m: usize, size: usize) {
    for _ in 0..m {
        let p = unsafe { libc::malloc(size) } as *mut u8;
        unsafe { std::ptr::write_volatile(p, 1) };
    }
}

/// N blocks through every allocation function, all freed again.
#[inline(never)]
pub fn churn_and_free(n: usize) {
    for i in 0..n {
        unsafe {
            let a = libc::malloc(64 + i % 64);
            let b = libc::calloc(4, 32);
            let c = libc::realloc(libc::malloc(16), 256);
            let mut d = std::ptr::null_mut();
            libc::posix_memalign(&mut d, 64, 128);
            let e = libc::aligned_alloc(64, 192);
            let f = libc::memalign(64, 320);
            for p in [a, b, c, d, e, f] {
                libc::free(black_box(p));
            }
        }
    }
}

/// An anonymous mapping of SIZE bytes, never unmapped, and one unmapped.
#[inline(never)]
pub fn leak_mapping(size: usize) {
    let map = || unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    black_box(map());
    let p = map();
    unsafe { libc::munmap(p, size) };
}

/// `leak K SIZE M BIG N [LINGER_MS]`.
pub fn leak(k: usize, size: usize, m: usize, big: usize, n: usize, linger_ms: u64) {
    leak_small_blocks(k, size);
    leak_big_blocks(m, big);
    churn_and_free(n);
    std::thread::sleep(Duration::from_millis(linger_ms));
}

/// `phases K SIZE GAP_MS [step]`: K blocks, a pause, K more from another
/// function. With `step`, after the first K it says "first phase done"
/// and waits for a line on stdin (or its end) instead of the pause.
#[inline(never)]
pub fn leak_in_second_phase(k: usize, size: usize) {
    for _ in 0..k {
        let p = unsafe { libc::malloc(size) } as *mut u8;
        unsafe { std::ptr::write_volatile(p, 2) };
    }
}

pub fn phases(k: usize, size: usize, gap_ms: u64, step: bool) {
    leak_small_blocks(k, size);
    if step {
        use std::io::{BufRead, Write};
        println!("first phase done");
        std::io::stdout().flush().unwrap();
        let _ = std::io::stdin().lock().read_line(&mut String::new());
    } else {
        std::thread::sleep(Duration::from_millis(gap_ms));
    }
    leak_in_second_phase(k, size);
    std::thread::sleep(Duration::from_millis(gap_ms));
}

/// `malloc-loop N`: N malloc(16)/free pairs; `calloc-loop N`: N
/// calloc(1, 16)/free pairs; `realloc-loop N`: N realloc calls on one
/// block, between 16 and 48 bytes (the benchmark's loops). Prints the
/// loop's own time.
pub fn timed_loop(which: &str, n: usize) {
    let t = std::time::Instant::now();
    match which {
        "calloc-loop" => calloc_loop(n),
        "realloc-loop" => realloc_loop(n),
        _ => malloc_loop(n),
    }
    println!("elapsed_ns {}", t.elapsed().as_nanos());
}

#[inline(never)]
pub(crate) fn malloc_loop(n: usize) {
    for _ in 0..n {
        unsafe { libc::free(black_box(libc::malloc(16))) };
    }
}

#[inline(never)]
fn calloc_loop(n: usize) {
    for _ in 0..n {
        unsafe { libc::free(black_box(libc::calloc(1, 16))) };
    }
}

#[inline(never)]
fn realloc_loop(n: usize) {
    let mut p = unsafe { libc::malloc(16) };
    for i in 0..n {
        p = black_box(unsafe { libc::realloc(p, 16 + 32 * (i & 1)) });
    }
    unsafe { libc::free(p) };
}

/// `realloc-churn N KEEP`: N blocks of 2 KiB, each grown to 4 KiB and then
/// to 12 KiB while a neighbour keeps it from growing in place, freed unless
/// KEEP. Under byte sampling many blocks are sampled at one call and not at
/// the next: a sampled block's release by an unsampled realloc must be seen.
/// The slot each realloc frees is taken by a block held elsewhere, so no
/// later allocation at the same address can hide a release that was missed.
#[inline(never)]
pub fn realloc_churn(n: usize, keep: bool) {
    for _ in 0..n {
        unsafe {
            let a = libc::malloc(2048);
            // Not from the small-block cache: placed right after `a`.
            let fence = libc::malloc(2048);
            let b = libc::realloc(a, 4096);
            // black_box: an unused block's calls would be optimised away.
            let c = black_box(libc::realloc(b, 12288));
            hold_freed_slot();
            if !keep {
                libc::free(c);
            }
            libc::free(black_box(fence));
        }
    }
}

#[inline(never)]
fn hold_freed_slot() {
    let p = unsafe { libc::malloc(2048) } as *mut u8;
    unsafe { std::ptr::write_volatile(p, 3) };
}

/// `pipes N KEEP LINGER_MS`: N pipes, left open (KEEP=1) or closed at once;
/// each holds kernel memory (the pipe and its buffer array) while open.
pub fn pipes(n: usize, keep: bool, linger_ms: u64) {
    let mut fds = Vec::with_capacity(n);
    for _ in 0..n {
        let mut p = [0; 2];
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0, "pipe");
        if keep {
            fds.push(p);
        } else {
            unsafe { libc::close(p[0]) };
            unsafe { libc::close(p[1]) };
        }
    }
    std::thread::sleep(Duration::from_millis(linger_ms));
    black_box(fds);
}

/// One block of MIB MiB from malloc, every page touched, never freed: a
/// heap that grows toward its group's limit (memcg --heap's tests).
#[inline(never)]
pub fn grow_heap_mib(mib: usize) {
    let len = mib << 20;
    let p = unsafe { libc::malloc(len) } as *mut u8;
    assert!(!p.is_null(), "malloc({len})");
    for i in (0..len).step_by(4096) {
        unsafe { std::ptr::write_volatile(p.add(i), 1) };
    }
}

/// Waits until memtrace's allocator shim is mapped into this process, up
/// to `ms` (from MEMTRACE_WAIT_SHIM_MS; no wait without it): memcg --heap
/// loads it some milliseconds after the process appears, later on a loaded
/// host, and what is allocated before that is not seen (said in the
/// README). A test that counts what is held waits for it, as it waits for
/// the tracer to be ready. Says on stderr when the shim never came.
/// Whether it was told to wait.
pub fn wait_for_shim() -> bool {
    let Some(ms) = std::env::var("MEMTRACE_WAIT_SHIM_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return false;
    };
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_millis(ms) {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        if maps.contains("memtrace-preload-") {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    eprintln!("memtrace-workload: no allocator shim was loaded in {ms} ms");
    true
}

/// Where this program's calls of malloc go (read through its GOT, which
/// memleak -p's injection rewrites).
#[inline(never)]
pub fn malloc_now() -> usize {
    black_box(libc::malloc as *const () as usize)
}

/// `got-watch K SIZE`: where this program's calls of malloc go (read
/// through its own GOT, as each call does) at start, then on each line on
/// stdin: "during" (K blocks of SIZE leaked from `leak_small_blocks`,
/// and whether malloc's address changed) or "after" (the same, plus
/// churn that must still work), until stdin closes. memleak -p's
/// injection rewrites that slot while it runs and must put it back.
pub fn got_watch(k: usize, size: usize) {
    use std::io::{BufRead, Write};
    let start = malloc_now();
    println!("ready");
    std::io::stdout().flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        leak_small_blocks(k, size);
        malloc_loop(1000);
        let same = if malloc_now() == start {
            "same"
        } else {
            "changed"
        };
        println!("{} {same}", line.trim());
        std::io::stdout().flush().unwrap();
    }
}

#[inline(never)]
fn first_owner(k: usize) -> Vec<*mut libc::c_void> {
    (0..k).map(|_| unsafe { libc::malloc(100) }).collect()
}

#[inline(never)]
fn second_owner(k: usize) -> Vec<*mut libc::c_void> {
    // calloc: a body of its own (identical functions are merged).
    (0..k).map(|_| unsafe { libc::calloc(1, 100) }).collect()
}

/// `reuse-then-exit K`: K blocks of 100 bytes from `first_owner`, freed,
/// K more from `second_owner` (the allocator hands the same addresses out
/// again), then _exit: no destructor runs, and frees memleak's shim holds
/// in a batch are only reported at the exit.
pub fn reuse_then_exit(k: usize) {
    for p in first_owner(k) {
        unsafe { libc::free(p) };
    }
    black_box(second_owner(k));
    unsafe { libc::_exit(0) };
}

/// `freed-then-idle K`: K blocks from `first_owner`, all freed, then "freed"
/// and a minute of sleep (a report comes while the frees would still be in
/// the shim's batch).
pub fn freed_then_idle(k: usize) {
    use std::io::Write;
    for p in first_owner(k) {
        unsafe { libc::free(p) };
    }
    println!("freed");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

/// K blocks of `size` bytes, never freed (no vector of them: its buffer
/// would be held here too).
#[inline(never)]
fn kept_owner(k: usize, size: usize) {
    for _ in 0..k {
        std::hint::black_box(unsafe { libc::malloc(size) });
    }
}

/// `kept-then-idle K`: K blocks of 100 bytes from `kept_owner`, then idle:
/// with memleak's memo the shim holds most of them in its batch until a
/// report reads it.
pub fn kept_then_idle(k: usize) {
    use std::io::Write;
    kept_owner(k, 100);
    println!("kept");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

#[inline(never)]
fn handed_over() -> usize {
    unsafe { libc::malloc(48) as usize }
}

/// `handoff N K`: N blocks of 48 bytes from `handed_over`, each freed by
/// another thread (its free may reach memleak before its allocation: the
/// two threads' batches go separately), then K kept from `kept_owner`.
pub fn handoff(n: usize, k: usize) {
    let (tx, rx) = std::sync::mpsc::sync_channel::<usize>(1024);
    let freer = std::thread::spawn(move || {
        for p in rx {
            unsafe { libc::free(p as *mut libc::c_void) };
        }
    });
    for _ in 0..n {
        tx.send(handed_over()).unwrap();
    }
    drop(tx);
    freer.join().unwrap();
    kept_owner(k, 48);
}
