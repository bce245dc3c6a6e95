//! Libraries a process maps after its allocator calls were pointed at the
//! shim (a dlopen): their calls would go to the allocator unseen, so each
//! housekeeping round looks for code mapped from a file the last redirect
//! did not know, and redirects again (`Injection::catch_up`). What such a
//! library allocates between its load and that round is not seen.

use std::collections::{HashMap, HashSet};

use super::Injected;

/// Redirects that may find a file's slots not yet written (mapped, not yet
/// relocated) before it is taken as it is: a slot bound elsewhere on
/// purpose would otherwise have the process stopped every round.
const TRIES: u8 = 8;

impl Injected {
    /// The files whose code the process maps now: not a JIT's memfd or a
    /// deleted file, which no loader binds (and a JIT maps them often).
    pub(super) fn mapped_code(&self) -> HashSet<String> {
        crate::process::maps::read_maps(self.pid)
            .unwrap_or_default()
            .iter()
            .filter(|m| m.perms.contains('x') && m.path.starts_with('/'))
            .filter(|m| !m.path.starts_with("/memfd:") && !m.path.ends_with(" (deleted)"))
            .map(|m| m.path.to_string())
            .collect()
    }

    /// Whether code from a file not known at the last redirect is mapped.
    pub fn mapped_since(&self) -> bool {
        !self.restored && !self.mapped_code().is_subset(&self.known)
    }
}

/// After a redirect looked at `file`: while its slots are not all written
/// by the loader yet it stays unknown, so the next round looks again (up
/// to `TRIES` times; `unsettled` counts them).
pub(super) fn settle(
    unsettled: &mut HashMap<String, u8>,
    known: &mut HashSet<String>,
    file: &str,
    settled: bool,
) {
    if settled {
        unsettled.remove(file);
        return;
    }
    let n = unsettled.entry(file.to_string()).or_default();
    *n += 1;
    if *n < TRIES {
        known.remove(file);
    }
}
