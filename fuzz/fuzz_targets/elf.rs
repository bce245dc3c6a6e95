//! An object a traced process maps (its allocator's symbols), and the code
//! where a probe is placed.
#![no_main]
use libfuzzer_sys::fuzz_target;
use memtrace::session::uprobe::{placement, Symbols};

fuzz_target!(|data: &[u8]| {
    // The bytes as code, as a function's first instructions are.
    let _ = placement(data, &[iced_x86::Register::RDI], true);
    let Ok(syms) = Symbols::parse(data.to_vec()) else {
        return;
    };
    for name in ["malloc", "free", "je_malloc"] {
        if let Some(f) = syms.function(name) {
            let _ = placement(&f.code, &[iced_x86::Register::RDI], false);
        }
    }
});
