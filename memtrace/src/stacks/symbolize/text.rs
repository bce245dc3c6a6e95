//! How a symbolized frame reads: a symbol with its line and module, and
//! the one frame that stands for code no file placed.

use crate::output::frame::{FrameStyle, NOT_A_FILE};
use crate::output::Shown;

/// The frame that stands for addresses no file placed in an exited
/// process's stack.
pub const NOT_PLACED: &str = "[code not placed: the process was gone before its maps were read]";

/// `frames` with each run of addresses no file placed ("0x7f.. [unknown]")
/// as one `NOT_PLACED` frame: they differ from process to process (ASLR)
/// and, once the process is gone, can never be placed.
pub fn placeless(frames: Vec<Shown>) -> Vec<Shown> {
    let mut out: Vec<Shown> = Vec::with_capacity(frames.len());
    for f in frames {
        if !unplaced(&f) {
            out.push(f);
        } else if out.last().is_none_or(|l| &**l != NOT_PLACED) {
            out.push(NOT_PLACED.into());
        }
    }
    out
}

/// An address no file placed ("0x7f.. [unknown]").
pub fn unplaced(f: &str) -> bool {
    f.starts_with("0x")
        && [NOT_A_FILE[0], NOT_A_FILE[2]].iter().any(|m| {
            f.strip_suffix(']')
                .and_then(|f| f.strip_suffix(m))
                .is_some_and(|f| f.ends_with('['))
        })
}

pub(super) fn module_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

pub(super) fn describe(
    sym: &blazesym::symbolize::Sym<'_>,
    module: &str,
    style: FrameStyle,
) -> String {
    let mut s = match style {
        FrameStyle::Addresses => format!("{}+{:#x}", sym.name, sym.offset),
        _ => sym.name.to_string(),
    };
    if let (Some(ci), false) = (&sym.code_info, style == FrameStyle::Function) {
        if let Some(line) = ci.line {
            s.push_str(&format!(" ({}:{line})", ci.file.to_string_lossy()));
        }
    }
    if !module.is_empty() {
        s.push_str(&format!(" [{module}]"));
    }
    s
}
