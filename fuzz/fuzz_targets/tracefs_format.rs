//! A tracepoint's `format` file, as tracefs (or anything mounted there) gives it.
#![no_main]
use libfuzzer_sys::fuzz_target;
use memtrace::kernel::Format;

fuzz_target!(|data: &[u8]| {
    let f = Format::parse(&String::from_utf8_lossy(data));
    for field in &f.fields {
        let _ = f.offset(&field.name);
    }
    let _ = f.offset("common_pid");
});
