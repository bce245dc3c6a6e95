//! Whether memleak's command can preload the allocator shim
//! (`probes::heap::shim`) and its running process can load it, and the
//! command's environment that preloads it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use memtrace_common::names::ML_MEMO;

use super::Args;
use crate::session::uprobe::{interpreter, Interp};
use crate::stacks::Traced;

/// Why the shim cannot serve `a`'s command, or None when it can.
pub fn unusable(a: &Args) -> Option<String> {
    let cmd = a.common.command.as_deref()?;
    if a.no_preload {
        return Some("--no-preload".into());
    }
    if a.object.is_some() || !a.symbol_prefix.is_empty() {
        return Some("-O/--symbol-prefix name another allocator".into());
    }
    if !crate::probes::heap::shim::built() {
        return Some("built without it".into());
    }
    // A simple command is exec'd as it is: an executable glibc's loader
    // does not run (static, another libc) or runs securely (set-id)
    // would not load the shim. A shell line runs /bin/sh first.
    if !crate::process::command::is_simple(cmd) {
        return None;
    }
    let word = cmd.split_whitespace().next()?;
    let path = crate::process::command::program_path(word)?;
    let meta = std::fs::metadata(&path).ok()?;
    if meta.permissions().mode() & 0o6000 != 0 {
        return Some(format!(
            "{} is set-id (its loader ignores preloads)",
            path.display()
        ));
    }
    match interpreter(&path) {
        Interp::Static => Some(format!("{} is statically linked", path.display())),
        Interp::Other(i) if !i.contains("ld-linux") => Some(format!(
            "{} is loaded by {i}, not glibc's loader",
            path.display()
        )),
        _ => None,
    }
}

/// Whether `-p` may load the shim into the process (else uprobes).
pub fn injectable(a: &Args) -> bool {
    !a.no_inject
        && a.object.is_none()
        && a.symbol_prefix.is_empty()
        && crate::probes::heap::shim::built()
}

/// The command's environment: the shim first in LD_PRELOAD, and the
/// sampling rate it applies (with the memo's socket, `memo`, after it).
pub fn env(shim: &Path, a: &Args, memo: Option<&str>) -> Vec<(String, String)> {
    let mut preload = shim.display().to_string();
    if let Some(v) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload = format!("{preload}:{}", v.to_string_lossy());
    }
    let mut config = a.sample_bytes.unwrap_or(0).to_string();
    if let Some(name) = memo {
        config = format!("{config},memo={name}");
    }
    vec![
        ("LD_PRELOAD".into(), preload),
        ("MEMTRACE_PRELOAD_SAMPLE".into(), config),
    ]
}

/// The memo's socket name when the shim gets one: every allocation
/// followed (no sampling, no size bounds, which the shim does not apply).
pub fn memo_name(a: &Args, preload: bool) -> Option<String> {
    let exact = a.sample_bytes.is_none() && a.min_size.is_none() && a.max_size.is_none();
    (preload && exact)
        .then(crate::probes::heap::memo::name)
        .flatten()
}

/// Serves the memo's maps at `name` (a failure is said, and the shim's
/// allocations all trap).
pub fn serve_memo(s: &Traced, name: &str, verbose: bool) {
    let gen = match s.sym.maps.lock() {
        Ok(mut m) => m.ktables.as_mut().map(|k| k.gen_fd()),
        Err(_) => None,
    };
    let r = match (s.array_fd(ML_MEMO), gen) {
        (Ok(slots), Some(Ok(gen))) => {
            crate::probes::heap::memo::serve(name, [slots, gen]).map_err(|e| e.to_string())
        }
        (Err(e), _) => Err(e.to_string()),
        (_, Some(Err(e))) => Err(format!("the generation page: {e}")),
        (_, None) => Err("no in-kernel unwinder (no stacks to memoize)".into()),
    };
    match r {
        Ok(()) if verbose => say!("memtrace: memleak: shim's memo of stacks served at @{name}"),
        Err(e) if verbose => say!("memtrace: memleak: no memo of stacks for the shim: {e}"),
        _ => {}
    }
}
