//! What the syscall snoops share: argument and result offsets from the
//! format files, and the decoding of flags, errnos and keys.

pub mod decode;

use crate::error::{Error, Result};
use crate::output::Value;
use crate::session::Prep;

/// Offsets of a syscall tracepoint's argument fields, from its format file.
/// The kernel programs take each as an 8-byte word of the record's first 64
/// bytes (read at once), so each must be one.
pub fn arg_offsets<const N: usize>(
    _k: &Prep,
    tracepoint: &str,
    fields: [&str; N],
) -> Result<[u32; N]> {
    word_offsets(tracepoint, fields)
}

/// `arg_offsets` outside a tool's `prepare` (shared mechanisms).
pub fn word_offsets<const N: usize>(tracepoint: &str, fields: [&str; N]) -> Result<[u32; N]> {
    let f = crate::kernel::tracefs::Format::load("syscalls", tracepoint)?;
    let mut out = [0u32; N];
    for (o, name) in out.iter_mut().zip(fields) {
        let field = f.field(name).ok_or_else(|| Error::NoField {
            tracepoint: tracepoint.into(),
            field: name.into(),
        })?;
        if field.size != 8 || field.offset % 8 != 0 || field.offset >= 64 {
            return Err(Error::Runtime(format!(
                "{tracepoint}: field {name} is {} bytes at {}, memtrace reads an \
                 aligned 8-byte word in the first 64",
                field.size, field.offset
            )));
        }
        *o = field.offset;
    }
    Ok(out)
}

/// Offset of `ret` in a `sys_exit_*` tracepoint.
pub fn ret_offset(k: &Prep, tracepoint: &str) -> Result<u32> {
    Ok(arg_offsets(k, tracepoint, ["ret"])?[0])
}

/// memtrace's own pid: the kernel programs skip it.
pub fn self_tgid() -> u32 {
    std::process::id()
}

pub fn hex(v: u64) -> Value {
    Value::S(format!("{v:#x}"))
}
