//! The allocator shim loaded into a running process (process::inject), for
//! `memleak -p` and memcg's `--heap`: the process's allocator calls reach
//! the shim's report sites as a preloaded command's do, so sampling costs
//! what it costs in a `-c` command instead of a trap per call. Where
//! loading it is not safe or fails, one line says why and uprobes take
//! over.

use std::path::Path;

use crate::error::{Error, Result};
use crate::output::Value;
use crate::process::inject::Injected;

/// The injection and what to say of it.
pub type Started = (Injection, Vec<String>);

pub struct Injection {
    pid: u32,
    /// The tool, in what is said.
    tool: &'static str,
    inner: Injected,
    /// Slots and objects redirected, slots put back and slots the process
    /// had rewritten itself by then.
    redirected: (usize, usize),
    restored: Option<(usize, usize)>,
    /// Files mapped after the first redirect whose calls were pointed at
    /// the shim later (`catch_up`).
    late: usize,
}

impl Injection {
    /// Loads the shim into `pid`; Err(why) when uprobes must do instead.
    pub fn start(
        pid: u32,
        shim: &Path,
        sample: u64,
        tool: &'static str,
    ) -> std::result::Result<Started, String> {
        let inner =
            Injected::load(pid, shim, super::shim::bytes(), sample).map_err(|e| e.to_string())?;
        let from = match inner.own_copy() {
            true => {
                "a sealed memfd of its own (another mount namespace: nothing written to its files)"
                    .to_string()
            }
            false => shim.display().to_string(),
        };
        let mut said =
            vec![format!(
            "allocator: {}, through the shim loaded into pid {pid} from {from} (its allocator calls \
             are pointed at the shim once the probes are on; one probe per call, at an emulated \
             nop; sampling done in the process)",
            if inner.allocator.is_empty() { "the process's" } else { &inner.allocator },
        )];
        if !inner.kept.is_empty() {
            said.push(format!(
                "kept as the process defines them (not the shim's): {}",
                inner.kept.join(", ")
            ));
        }
        let me = Injection {
            pid,
            tool,
            inner,
            redirected: (0, 0),
            restored: None,
            late: 0,
        };
        Ok((me, said))
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Lets go without putting anything back (the process exec'd).
    pub fn abandon(&mut self) {
        self.inner.abandon();
        self.restored = Some((0, 0));
    }

    /// Slots put back and slots the process had rewritten, once restored.
    pub fn restored(&self) -> Option<(usize, usize)> {
        self.restored
    }

    /// The shim as memtrace reaches it, for the probes on its sites.
    pub fn shim(&self) -> &Path {
        &self.inner.shim
    }

    /// Once the probes are on: the process's calls go to the shim.
    pub fn redirect(&mut self, verbose: bool) -> Result<()> {
        self.redirected = self
            .inner
            .redirect()
            .map_err(|e| Error::Runtime(format!("{}: pid {}: {e}", self.tool, self.pid)))?;
        let (slots, objects) = self.redirected;
        if slots == 0 {
            say!(
                "memtrace: {}: warning: no allocator call of pid {} could be pointed at the shim \
                 (no object binds them by name): its allocations will not be seen",
                self.tool,
                self.pid
            );
        } else if verbose {
            say!(
                "memtrace: {}: {slots} allocator call slots in {objects} objects of pid {} point at the shim",
                self.tool,
                self.pid
            );
        }
        Ok(())
    }

    /// At each housekeeping round: a library the process mapped since the
    /// last redirect (a dlopen) gets its allocator calls pointed at the
    /// shim too, and it is said, with what that leaves unseen.
    /// Returns how many libraries it pointed at the shim.
    pub fn catch_up(&mut self) -> usize {
        if self.restored.is_some() || !self.inner.mapped_since() {
            return 0;
        }
        match self.inner.redirect() {
            Ok((slots, _)) => self.redirected.0 = slots,
            Err(e) => {
                say!(
                    "memtrace: {}: warning: pid {} mapped more code, whose allocator calls could \
                     not be pointed at the shim: {e} (they are not seen)",
                    self.tool,
                    self.pid
                );
                return 0;
            }
        }
        let newly = std::mem::take(&mut self.inner.newly);
        for (file, n) in &newly {
            self.late += 1;
            say!(
                "memtrace: {}: pid {} loaded {file} after the shim went in: its {n} allocator \
                 call slots point at the shim from now on (what it allocated before was not seen)",
                self.tool,
                self.pid
            );
        }
        newly.len()
    }

    /// Every call put back as it was (said: the process was changed).
    pub fn restore(&mut self) {
        if self.restored.is_some() {
            return;
        }
        match self.inner.restore() {
            // Gone: nothing to put back into.
            Ok(None) => self.restored = Some((0, 0)),
            Ok(Some((put, changed))) => {
                self.restored = Some((put, changed));
                let also = if changed > 0 {
                    format!(" ({changed} the process had rewritten since are left as it made them)")
                } else {
                    String::new()
                };
                if self.redirected.0 > 0 {
                    say!(
                        "memtrace: {}: pid {}'s allocator calls put back ({put} of {} slots){also}",
                        self.tool,
                        self.pid,
                        self.redirected.0
                    );
                }
            }
            Err(e) => say!(
                "memtrace: {}: warning: pid {}'s allocator calls could not be put back: {e} \
                 (they still go through the shim, which forwards them)",
                self.tool,
                self.pid
            ),
        }
    }

    pub fn summary(&self) -> Vec<(&'static str, Value)> {
        let (put, changed) = self.restored.unwrap_or((0, 0));
        vec![
            ("injected_slots", Value::from(self.redirected.0 as u64)),
            ("restored_slots", Value::from(put as u64)),
            ("slots_changed_by_process", Value::from(changed as u64)),
            ("libraries_redirected_late", Value::from(self.late as u64)),
        ]
    }
}
