//! Short-lived processes: children that exec, fault or move the break
//! inside glibc, and exit within milliseconds, before a tracer could read
//! their maps from /proc.

use std::hint::black_box;

use crate::{map_anon, PAGE};

/// `exec-short N ARGS...`: runs this binary with ARGS, N times, one after
/// the other (fork and exec, then wait).
pub fn exec_short(n: usize, args: &[String]) {
    let me = std::env::current_exe().expect("own path");
    for _ in 0..n {
        let st = std::process::Command::new(&me)
            .args(args)
            .status()
            .expect("run child");
        assert!(st.success(), "child failed: {st}");
    }
}

/// Fills `len` bytes at `p` with glibc's memset: every first touch of a
/// page faults inside the library.
#[inline(never)]
fn fill_with_memset(p: *mut u8, len: usize) {
    // SAFETY: the caller's mapping is at least `len` bytes long.
    unsafe { black_box(libc::memset(p as *mut libc::c_void, 1, len)) };
}

/// `memset-pages N`: N fresh pages, each first touched by glibc's memset.
#[inline(never)]
pub fn fault_in_libc(n: usize) {
    let p = map_anon(n * PAGE);
    fill_with_memset(p, n * PAGE);
    black_box(p);
}
