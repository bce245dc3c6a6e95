#![no_main]
//! The unwind-table compiler on any bytes: every ELF a traced process maps
//! reaches it (a container can map whatever it likes).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = memtrace::stacks::ktables::build::bytes_rows(data);
});
