//! `late-lib LIB K SIZE`: a library loaded while memleak -p runs.

use std::io::{BufRead, Write};

/// Says "ready" (once the shim is in, when told: `leak::wait_for_shim`);
/// then on "load" dlopens LIB ("loaded"), on "leak" keeps K
/// blocks of SIZE from its `late_leak` ("leaked"), until stdin closes.
pub fn late_lib(lib: &str, k: usize, size: usize) {
    let mut leak: Option<extern "C" fn(usize, usize)> = None;
    let start = crate::leak::malloc_now();
    if crate::leak::wait_for_shim() {
        // And until this program's own calls point at it (memcg --heap
        // loads the shim, then redirects): the library loads after that.
        let t0 = std::time::Instant::now();
        while crate::leak::malloc_now() == start
            && t0.elapsed() < std::time::Duration::from_secs(10)
        {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
    println!("ready");
    std::io::stdout().flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        match line.unwrap().trim() {
            "load" => {
                let path = std::ffi::CString::new(lib).unwrap();
                // SAFETY: a library of the test's, with a C function.
                let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
                assert!(!h.is_null(), "dlopen {lib}");
                let f = unsafe { libc::dlsym(h, c"late_leak".as_ptr()) };
                assert!(!f.is_null(), "{lib}: no late_leak");
                leak = Some(unsafe {
                    std::mem::transmute::<*mut libc::c_void, extern "C" fn(usize, usize)>(f)
                });
                println!("loaded");
            }
            "leak" => {
                leak.expect("load first")(k, size);
                println!("leaked");
            }
            _ => {}
        }
        std::io::stdout().flush().unwrap();
    }
}
