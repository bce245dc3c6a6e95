//! Workloads with known counts for memtrace's integration tests and benches.
//! Built with frame pointers (see .cargo/config.toml) so stacks walk.
//!
//! `memtrace-workload [--wait] COMMAND ARGS`: with --wait, prints its pid and
//! waits for a line on stdin before it works, so a tracer can attach first.

use std::io::{BufRead, Write};

mod brk;
mod forks;
mod late;
mod leak;
mod paced;
mod pages;
mod raw;
mod short;
mod snoop;
mod swap;

use brk::{grow_heap_with_raw_brk, grow_heap_with_sbrk, raw_brk_deep, raw_brk_deep_wide};

pub(crate) const PAGE: usize = 4096;

pub(crate) fn map_anon(len: usize) -> *mut u8 {
    // SAFETY: anonymous private mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert!(p != libc::MAP_FAILED, "mmap failed");
    // Exact counts need one fault per 4 KiB page.
    unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
    p as *mut u8
}

#[inline(never)]
fn touch_fresh_pages(n: usize) {
    if n == 0 {
        return;
    }
    let p = map_anon(n * PAGE);
    for i in 0..n {
        // SAFETY: inside the mapping.
        unsafe { std::ptr::write_volatile(p.add(i * PAGE), 1) };
    }
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> T {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn main() {
    // args_os: argv[0] may be a path that is not UTF-8 (hardening tests).
    let mut args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.into_string().expect("UTF-8 arguments"))
        .collect();
    // An extra touched region of exactly N MiB, mapped before --wait (what a
    // VMM's guest memory is to an RSS guard).
    if args.first().map(|s| s.as_str()) == Some("--extra-mib") {
        let len = args[1].parse::<usize>().unwrap() << 20;
        args.drain(..2);
        // Shared, so the kernel never merges it with the private heap
        // regions next to it: it stays one mapping of exactly that size.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(p != libc::MAP_FAILED);
        for i in (0..len).step_by(PAGE) {
            unsafe { std::ptr::write_volatile((p as *mut u8).add(i), 1) };
        }
    }
    let pre = paced::prepare(&args);
    if args.first().map(|s| s.as_str()) == Some("--wait") {
        args.remove(0);
        println!("{}", std::process::id());
        std::io::stdout().flush().unwrap();
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).unwrap();
    }
    let cmd = args.first().cloned().unwrap_or_default();
    match cmd.as_str() {
        // sbrk N SIZE: N calls of sbrk(SIZE).
        // [HOLD_MS]: then say "done" and stay alive that long (handshakes).
        "sbrk" => {
            grow_heap_with_sbrk(arg(&args, 1, 10), arg(&args, 2, 4096));
            let hold = arg(&args, 3, 0u64);
            if hold > 0 {
                println!("done");
                std::thread::sleep(std::time::Duration::from_millis(hold));
            }
        }
        // rawbrk N SIZE: N brk(2) calls growing the heap by SIZE, without glibc.
        "rawbrk" => {
            grow_heap_with_raw_brk(arg(&args, 1, 10), arg(&args, 2, 4096));
            // [LINGER_MS]: stay alive after, for reports taken meanwhile.
            std::thread::sleep(std::time::Duration::from_millis(arg(&args, 3, 0)));
        }
        // brk-exec N SIZE MS PROG [ARGS]: rawbrk N SIZE, MS later exec PROG
        // (a stack taken before an exec, reported after it).
        "brk-exec" => {
            use std::os::unix::process::CommandExt;
            grow_heap_with_raw_brk(arg(&args, 1, 10), arg(&args, 2, 4096));
            std::thread::sleep(std::time::Duration::from_millis(arg(&args, 3, 0)));
            let err = std::process::Command::new(&args[4]).args(&args[5..]).exec();
            panic!("exec {}: {err}", args[4]);
        }
        // deepbrk DEPTH N: rawbrk N 4096 below DEPTH frames of recursion.
        "deepbrk" => raw_brk_deep(arg(&args, 1, 100), arg(&args, 2, 10)),
        // rawbrk-deep N DEPTH M: rawbrk N 4096, then deepbrk DEPTH M: two
        // stacks in one process (record diffs).
        "rawbrk-deep" => {
            grow_heap_with_raw_brk(arg(&args, 1, 10), 4096);
            raw_brk_deep(arg(&args, 2, 3), arg(&args, 3, 5));
        }
        // widebrk DEPTH N: the same with 1 KiB frames.
        "widebrk" => raw_brk_deep_wide(arg(&args, 1, 30), arg(&args, 2, 10)),
        // touch N: touch N fresh anonymous pages.
        "touch" => touch_fresh_pages(arg(&args, 1, 0)),
        // touch-timed N: the same, printing the loop's time in ns (benchmarks).
        "touch-timed" => {
            let t = std::time::Instant::now();
            touch_fresh_pages(arg(&args, 1, 0));
            println!("elapsed_ns {}", t.elapsed().as_nanos());
        }
        // zero-faults N ROUNDS: read one byte of each of N fresh anonymous
        // pages, ROUNDS times: each read maps the shared zero page, a fault
        // with no allocation or zeroing, so a tracer's cost per fault shows
        // clearly. Prints the loop's time.
        "zero-faults" => {
            let (n, rounds) = (arg(&args, 1, 10000usize), arg(&args, 2, 10usize));
            let t = std::time::Instant::now();
            for _ in 0..rounds {
                pages::read_zero_pages(n);
            }
            println!("elapsed_ns {}", t.elapsed().as_nanos());
        }
        // rawbrk-timed N: N brk calls, printing the loop's time in ns.
        // mmap-loop T N: T threads, started together, each mmap and munmap
        // a page N times (2N calls). Prints the time of the whole loop.
        "mmap-loop" => {
            let (t, n) = (arg(&args, 1, 2usize), arg(&args, 2, 100000usize));
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(t + 1));
            let hs: Vec<_> = (0..t)
                .map(|_| {
                    let b = barrier.clone();
                    std::thread::spawn(move || {
                        b.wait();
                        for _ in 0..n {
                            let p = unsafe {
                                libc::mmap(
                                    std::ptr::null_mut(),
                                    PAGE,
                                    libc::PROT_READ,
                                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                                    -1,
                                    0,
                                )
                            };
                            unsafe { libc::munmap(p, PAGE) };
                        }
                    })
                })
                .collect();
            barrier.wait();
            let start = std::time::Instant::now();
            for h in hs {
                h.join().unwrap();
            }
            println!("elapsed_ns {}", start.elapsed().as_nanos());
            // Its own CPU time: the bench takes it from the tracer's total.
            let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
            unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
            let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
            println!("cpu_ns {}", (us(ru.ru_utime) + us(ru.ru_stime)) * 1000);
        }
        "rawbrk-timed" => {
            let t = std::time::Instant::now();
            grow_heap_with_raw_brk(arg(&args, 1, 10), 4096);
            println!("elapsed_ns {}", t.elapsed().as_nanos());
        }
        // threads T N: T threads each touch N fresh pages.
        "threads" => {
            let (t, n) = (arg(&args, 1, 2usize), arg(&args, 2, 1000usize));
            let hs: Vec<_> = (0..t)
                .map(|_| std::thread::spawn(move || touch_fresh_pages(n)))
                .collect();
            for h in hs {
                h.join().unwrap();
            }
        }
        // alloc MIB: allocate and touch MIB MiB (for OOM tests).
        "alloc" => pages::allocate_and_touch_mib(arg(&args, 1, 200)),
        // steps STEP_MIB N PAUSE_MS [EXTRA_MIB]: with --wait, first maps and
        // touches EXTRA_MIB (a region to exclude) before waiting; then N
        // steps of STEP_MIB, printing "step I" after each, pausing between.
        "steps" => {
            let (step, n, pause) = (
                arg(&args, 1, 8usize),
                arg(&args, 2, 4usize),
                arg(&args, 3, 300u64),
            );
            for i in 0..n {
                pages::allocate_and_touch_mib(step);
                println!("step {i}");
                std::io::stdout().flush().unwrap();
                std::thread::sleep(std::time::Duration::from_millis(pause));
            }
        }
        // heap-steps STEP_MIB N PAUSE_MS [HOLD_MS]: N blocks of STEP_MIB from
        // malloc, touched and kept, pausing between; then "held", and the
        // blocks kept HOLD_MS more. Waits for the shim first when told
        // (`leak::wait_for_shim`).
        "heap-steps" => {
            let (step, n, pause) = (
                arg(&args, 1, 1usize),
                arg(&args, 2, 300usize),
                arg(&args, 3, 10u64),
            );
            leak::wait_for_shim();
            for _ in 0..n {
                leak::grow_heap_mib(step);
                std::thread::sleep(std::time::Duration::from_millis(pause));
            }
            println!("held");
            std::io::stdout().flush().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(arg(&args, 4, 0)));
        }
        // hold MIB: allocate and touch MIB MiB, say "ready", then sleep.
        "hold" => {
            pages::allocate_and_touch_mib(arg(&args, 1, 40));
            println!("ready");
            std::io::stdout().flush().unwrap();
            std::thread::sleep(std::time::Duration::from_secs(60));
        }
        // readfile PATH K [HOLD_MS]: map PATH and read K distinct pages,
        // uncached; then stay HOLD_MS with the file mapped, so that a
        // tracer slower than the read (under emulation) can still name it.
        "readfile" => {
            pages::read_file_pages(&args[1], arg(&args, 2, 100));
            std::thread::sleep(std::time::Duration::from_millis(arg(&args, 3, 0)));
        }
        // fork-alloc MIB [LINGER_MS]: a forked child allocates and touches
        // MIB MiB, holds it for a second and exits; the parent waits for it,
        // then lingers.
        "fork-alloc" => forks::alloc(arg(&args, 1, 16), arg(&args, 2, 0)),
        // fork-chain DEPTH K SIZE HOLD_MS: DEPTH processes forked one from
        // the other, each after its parent ran malloc/free and kept K blocks
        // of SIZE; the last prints "ready" and holds HOLD_MS.
        "fork-chain" => forks::chain(
            arg(&args, 1, 10),
            arg(&args, 2, 3),
            arg(&args, 3, 1000),
            arg(&args, 4, 3000),
        ),
        // fork-sbrk N: a forked child calls sbrk N times; the parent none.
        "fork-sbrk" => forks::sbrk(arg(&args, 1, 10)),
        // fork-hold N MIB HOLD_MS: N children each touch MIB MiB of
        // anonymous memory and hold it; once all have, "ready" is printed;
        // they all exit after HOLD_MS.
        "fork-hold" => forks::hold(arg(&args, 1, 3), arg(&args, 2, 20), arg(&args, 3, 5000)),
        // fork-touch-many N PAGES: N children forked one after another, each
        // touching PAGES fresh pages from one function and exiting.
        "fork-touch-many" => {
            let pages = arg(&args, 2, 16usize);
            forks::one_after_another(arg(&args, 1, 100), || touch_fresh_pages(pages));
        }
        // fork-fault-files N DIR: N files mapped by the parent, each read
        // by a child of its own that exits at once.
        "fork-fault-files" => forks::fault_files(arg(&args, 1, 10), &args[2]),
        // fork-sbrk-many N CALLS: N children forked one after another, each
        // calling sbrk CALLS times from one function and exiting (churn).
        "fork-sbrk-many" => {
            let calls = arg(&args, 2, 5usize);
            forks::one_after_another(arg(&args, 1, 100), || grow_heap_with_sbrk(calls, 4096));
        }
        // reread PATH MIB ROUNDS: read a file again and again (reclaim tests).
        "reread" => {
            use std::io::Read;
            use std::os::fd::AsRawFd;
            let rounds = arg(&args, 2, 3usize);
            // Pages cached by whoever wrote the file are charged to that
            // writer's cgroup: drop them so our reads are charged to ours.
            let f = std::fs::File::open(&args[1]).expect("open");
            unsafe { libc::fsync(f.as_raw_fd()) };
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            let mut buf = vec![0u8; 1 << 20];
            // Pages cached by whoever wrote the file are charged to its
            // cgroup: drop them, so reading charges (and reclaims) ours.
            let f = std::fs::File::open(&args[1]).expect("open");
            unsafe { libc::fsync(f.as_raw_fd()) };
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            for _ in 0..rounds {
                let mut f = std::fs::File::open(&args[1]).expect("open");
                while f.read(&mut buf).unwrap() > 0 {}
            }
        }
        // maps [FILE]: mmap, mremap, munmap and failing mmaps (mmapsnoop tests).
        "maps" => snoop::maps(args.get(1).map(|s| s.as_str())),
        // swap MIB: pages swapped out by a memcg limit, then read back
        // (swapin tests); see swap.rs.
        "swap" => swap::swap(arg(&args, 1, 64)),
        // shm: one shmget, shmat, shmdt and shmctl(IPC_RMID) (shmsnoop tests).
        "shm" => snoop::shm(),
        // madvise N LEN [LEN2]: N madvise(MADV_NORMAL) calls of LEN bytes,
        // each followed by one of LEN2 when given (count/trace tests).
        "madvise" => snoop::advise(arg(&args, 1, 10), arg(&args, 2, 4096), arg(&args, 3, 0)),
        // badname N: names itself with an ESC sequence and a newline
        // (prctl(PR_SET_NAME)), then a forked child, which inherits that
        // name from its first fault on, touches N fresh pages.
        "badname" => {
            let name = b"ev\x1b[2Jil\nname\0";
            unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                touch_fresh_pages(arg(&args, 1, 100));
                unsafe { libc::_exit(0) };
            }
            forks::wait(pid);
        }
        // leak K SIZE M BIG N [LINGER_MS]: K blocks of SIZE and M of BIG
        // leaked, N rounds through every allocator function freed.
        "leak" => leak::leak(
            arg(&args, 1, 10),
            arg(&args, 2, 100),
            arg(&args, 3, 2),
            arg(&args, 4, 1 << 20),
            arg(&args, 5, 100),
            arg(&args, 6, 0),
        ),
        "leak-mapping" => leak::leak_mapping(arg(&args, 1, 1 << 20)),
        "phases" => leak::phases(
            arg(&args, 1, 10),
            arg(&args, 2, 100),
            arg(&args, 3, 1000),
            args.get(4).is_some_and(|s| s == "step"),
        ),
        "reuse-then-exit" => leak::reuse_then_exit(arg(&args, 1, 20)),
        "freed-then-idle" => leak::freed_then_idle(arg(&args, 1, 20)),
        "kept-then-idle" => leak::kept_then_idle(arg(&args, 1, 20)),
        // handoff N K: allocated in one thread, freed in another (leak.rs).
        "handoff" => leak::handoff(arg(&args, 1, 10000), arg(&args, 2, 10)),
        "got-watch" => leak::got_watch(arg(&args, 1, 10), arg(&args, 2, 100)),
        // late-lib LIB K SIZE: a library dlopen'd on request (late.rs).
        "late-lib" => late::late_lib(&args[1], arg(&args, 2, 10), arg(&args, 3, 100)),
        "pipes" => leak::pipes(arg(&args, 1, 100), arg(&args, 2, 1) != 0, arg(&args, 3, 0)),
        // malloc-loop, calloc-loop, realloc-loop N: timed allocator loops.
        "malloc-loop" | "calloc-loop" | "realloc-loop" => {
            leak::timed_loop(&args[0], arg(&args, 1, 1_000_000))
        }
        // realloc-churn N KEEP: N blocks reallocated twice (memleak tests).
        "realloc-churn" => leak::realloc_churn(arg(&args, 1, 1000), arg(&args, 2, 0) != 0),
        // paced FAULTS_PER_S BRKS_PER_S SECS, counted PAGES MMAPS BRKS: see paced.rs.
        "paced" => paced::paced(
            arg(&args, 1, 1000),
            arg(&args, 2, 100),
            arg(&args, 3, 3),
            pre.unwrap(),
        ),
        "counted" => paced::counted(
            arg(&args, 1, 0),
            arg(&args, 2, 0),
            arg(&args, 3, 0),
            pre.unwrap(),
        ),
        // exec-short N ARGS...: N short-lived children running ARGS.
        "exec-short" => short::exec_short(arg(&args, 1, 1), &args[2..]),
        // memset-pages N: N fresh pages first touched inside glibc's memset.
        "memset-pages" => short::fault_in_libc(arg(&args, 1, 10)),
        "exit" => std::process::exit(arg(&args, 1, 0)),
        "sleep" => std::thread::sleep(std::time::Duration::from_millis(arg(&args, 1, 1000))),
        _ => {
            eprintln!("unknown workload '{cmd}'");
            std::process::exit(2);
        }
    }
}
