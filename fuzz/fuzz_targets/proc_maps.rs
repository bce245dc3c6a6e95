#![no_main]
//! /proc/PID/maps, smaps and mounts: paths in them are the process's.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = memtrace::process::maps::parse_maps_bytes(data);
    let text = String::from_utf8_lossy(data);
    let _ = memtrace::process::proc::parse_smaps(&text);
    let _ = memtrace::kernel::mounts::parse_mounts(&text);
});
