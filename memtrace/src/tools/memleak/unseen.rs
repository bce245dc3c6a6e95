//! What memleak says at the end when it could not see a process's
//! allocator: an empty report is not "no leaks".

use memtrace_common::memleak::counter;

use super::Memleak;

impl Memleak {
    /// No allocation, free or call passed over by sampling or bounds: the
    /// allocator memleak probes was not the one the process used (or it
    /// made no call).
    fn saw_nothing(&self) -> bool {
        [
            counter::ALLOCS,
            counter::FREES,
            counter::FREE_UNKNOWN,
            counter::UNSAMPLED,
            counter::OUT_OF_BOUNDS,
        ]
        .iter()
        .all(|&i| self.counts[i as usize] == 0)
    }

    /// Said after the final report.
    pub(super) fn say_if_unseen(&self) {
        // A Go program's allocator calls no malloc: its heap is the Go
        // view's, which says itself what it could not read.
        if self.go.is_go() {
            return;
        }
        let lost = self.counts[counter::UNPRELOADED as usize];
        if lost > 0 {
            say!(
                "memtrace: memleak: warning: {lost} program(s) of the command were exec'd with \
                 LD_PRELOAD removed from their environment (env -i, or an environment built \
                 without it): that is obeyed, and their allocations were not seen"
            );
        }
        if self.preload.is_some() && self.counts[counter::PRELOADED as usize] == 0 {
            say!(
                "memtrace: memleak: warning: no process of the command loaded the allocator shim \
                 (a static or set-id program, or another libc): its allocations were not seen; \
                 run with --no-preload"
            );
        } else if let (true, Some(pid)) = (self.user && self.saw_nothing(), self.target) {
            // An empty report is not "no leaks" when nothing could be seen.
            let name = match &self.args.common.command {
                Some(c) => c.clone(),
                None => crate::process::proc::comm(pid).unwrap_or_default(),
            };
            let sampled = match self.args.sample_bytes {
                Some(n) => format!(" (none sampled, one per {n} bytes on average)"),
                None => String::new(),
            };
            say!(
                "memtrace: memleak: no allocator calls seen from PID {pid} ({name}){sampled}: \
                 the empty report is not \"no leaks\"; a static binary or another allocator \
                 is named with -O (and --symbol-prefix)"
            );
        }
    }
}
