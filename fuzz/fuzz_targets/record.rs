//! The record file reader: a record may come from another host or be cut
//! short, so every byte of it is untrusted.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = memtrace::record::format::Recording::read(data, "fuzz.rec");
});
