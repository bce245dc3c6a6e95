//! memtrace's own OOM score. It runs during memory incidents, and the OOM
//! killer it reports should not pick it: as root it sets its
//! oom_score_adj to -1000 (or what `--oom-score-adj` says) for the run. A
//! `-c` command gets back the value memtrace started with (children
//! inherit the score).

use std::fs;

const PATH: &str = "/proc/self/oom_score_adj";

/// What was done, for the line said at start.
pub struct Protection {
    /// The value memtrace started with, as written back in a `-c` child.
    pub original: Option<Vec<u8>>,
    pub said: String,
}

/// Sets memtrace's own score; a failure is said, not fatal.
pub fn apply(adj: i32) -> Protection {
    let original = fs::read(PATH).ok().map(|v| {
        let mut v = v;
        v.retain(|b| !b.is_ascii_whitespace());
        v
    });
    if original.as_deref() == Some(adj.to_string().as_bytes()) {
        return Protection {
            original: None,
            said: String::new(),
        };
    }
    let said = match fs::write(PATH, adj.to_string()) {
        Ok(()) if adj == -1000 => format!(
            "memtrace: oom_score_adj {adj}: the OOM killer passes memtrace over \
             (--oom-score-adj changes it)"
        ),
        Ok(()) => format!("memtrace: oom_score_adj {adj}"),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => format!(
            "memtrace: oom_score_adj left at {}: lowering it needs CAP_SYS_RESOURCE, \
             which memtrace lacks (the OOM killer may pick memtrace)",
            String::from_utf8_lossy(original.as_deref().unwrap_or(b"?"))
        ),
        Err(e) => format!("memtrace: oom_score_adj left as it was: {e}"),
    };
    Protection { original, said }
}
