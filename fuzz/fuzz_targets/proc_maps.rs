//! /proc/PID/maps, smaps and mounts: paths in them are any bytes a process chose.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = memtrace::process::proc::parse_maps_bytes(data);
    let text = String::from_utf8_lossy(data);
    let _ = memtrace::process::proc::parse_smaps(&text);
    let _ = memtrace::process::proc::parse_mounts(&text);
});
