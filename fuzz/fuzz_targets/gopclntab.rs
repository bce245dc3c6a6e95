#![no_main]
//! The reader of a Go binary's function table on any bytes: a traced
//! process maps whatever file it likes, and memtrace names its code and
//! finds where its stacks start from this table.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = memtrace::stacks::gopclntab::functions_in(
        data,
        &["runtime.goexit", "runtime.systemstack", "main.main"],
    );
});
