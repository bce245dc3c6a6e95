//! The allocator entry points memleak probes, by how each takes its
//! arguments: the C functions, C++'s operators, jemalloc's own API.

use iced_x86::Register;
use memtrace_common::memleak::shape;

/// Allocation functions with how they take their arguments, and the
/// argument registers the entry program reads for that shape.
pub const ALLOCATORS: &[(&str, u64)] = &[
    ("malloc", shape::SIZE),
    ("calloc", shape::CALLOC),
    ("realloc", shape::REALLOC),
    ("reallocarray", shape::REALLOCARRAY),
    ("posix_memalign", shape::POSIX_MEMALIGN),
    ("aligned_alloc", shape::ALIGNED),
    ("memalign", shape::ALIGNED),
    ("valloc", shape::SIZE),
    ("pvalloc", shape::PVALLOC),
];

/// C++'s operator new variants (plain, array; nothrow; aligned), size
/// first: probed where the allocator's object defines them (jemalloc,
/// tcmalloc serve them without calling their malloc). libstdc++'s call
/// malloc, which is probed already: they are not.
pub const CXX_NEW: &[&str] = &[
    "_Znwm",
    "_Znam",
    "_ZnwmRKSt9nothrow_t",
    "_ZnamRKSt9nothrow_t",
    "_ZnwmSt11align_val_t",
    "_ZnamSt11align_val_t",
    "_ZnwmSt11align_val_tRKSt9nothrow_t",
    "_ZnamSt11align_val_tRKSt9nothrow_t",
];

/// operator delete variants, the block first: each a free.
pub const CXX_DELETE: &[&str] = &[
    "_ZdlPv",
    "_ZdaPv",
    "_ZdlPvm",
    "_ZdaPvm",
    "_ZdlPvRKSt9nothrow_t",
    "_ZdaPvRKSt9nothrow_t",
    "_ZdlPvSt11align_val_t",
    "_ZdaPvSt11align_val_t",
    "_ZdlPvmSt11align_val_t",
    "_ZdaPvmSt11align_val_t",
    "_ZdlPvSt11align_val_tRKSt9nothrow_t",
    "_ZdaPvSt11align_val_tRKSt9nothrow_t",
];

/// jemalloc's own API where the allocator's object defines it: mallocx
/// takes the size first (its flags choose alignment, zeroing, arena),
/// rallocx the block and the size as realloc does. xallocx resizes in
/// place and returns a size, not a block: not probed (said).
pub const JE_ALLOC: &[(&str, u64)] = &[("mallocx", shape::SIZE), ("rallocx", shape::REALLOC)];
pub const JE_FREE: &[&str] = &["dallocx", "sdallocx"];

pub fn args_read(sh: u64) -> &'static [Register] {
    match sh {
        shape::CALLOC | shape::REALLOC => &[Register::RDI, Register::RSI],
        shape::REALLOCARRAY => &[Register::RDI, Register::RSI, Register::RDX],
        shape::ALIGNED => &[Register::RSI],
        shape::POSIX_MEMALIGN => &[Register::RDI, Register::RDX],
        _ => &[Register::RDI],
    }
}
