//! The warning printed while records are being lost, with advice that fits
//! the reason: only a full ring buffer is helped by a bigger one.

pub use crate::session::{is_degradation, DEGRADATIONS};

/// What to do about losses of one reason (`loss::NAMES`).
pub fn advice(reason: &str) -> &'static str {
    match reason {
        "ringbuf_full" => "the ring buffer filled up: a bigger --buffer-size keeps more in bursts",
        "map_full" => {
            "a counting map is full: trace fewer keys (-p PID), or report and clear them with -i"
        }
        "stack_fail" => {
            "the stack map is full or two stacks collided: fewer distinct stacks, or -i to report and clear"
        }
        "stack_copy_fail" => "the user stack could not be read (not resident)",
        "read_fail" => "kernel memory reads failed (usually processes exiting meanwhile)",
        "stack_truncated" => "stacks deeper than the walk keeps were cut (counted, still reported)",
        "tables_pending" => "stacks met code whose unwind tables were not built yet (a process just started) and were walked by frame pointers from there (still reported)",
        "processes_uncounted" => "which process took a stack shared by its image could not be told (ring buffer full): counts exact, some rows name fewer processes (--buffer-size)",
        "map_busy" => "a new key could not be allocated where the event fired (an interrupt, or inside the allocator traced)",
        "missed_runs" => {
            "the kernel skipped memtrace's programs while another BPF program ran on that CPU"
        }
        "stack_evicted" => "stacks asked for by a report had been let go under memtrace's bound on kept stacks (shown without their stack)",
        "map_read_fail" => "memtrace could not read entries of its own maps (they are missing from the report)",
        _ => "see the summary",
    }
}

/// The warning for `now`, counts by reason, if more were lost than in
/// `before` (the counts at the last warning); advice for the reasons that
/// grew.
pub fn warning(now: &[(&'static str, u64)], before: &[(&'static str, u64)]) -> Option<String> {
    let was = |r: &str| before.iter().find(|(b, _)| *b == r).map_or(0, |(_, n)| *n);
    let grew: Vec<String> = now
        .iter()
        .filter(|(r, n)| *n > was(r))
        .map(|(r, n)| format!("{r}={n} ({})", advice(r)))
        .collect();
    if grew.is_empty() {
        return None;
    }
    let total: u64 = now.iter().map(|(_, n)| n).sum();
    Some(format!(
        "memtrace: warning: {total} events lost so far; {}",
        grew.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(rb: u64, stack: u64, map: u64) -> Vec<(&'static str, u64)> {
        vec![
            ("ringbuf_full", rb),
            ("stack_fail", stack),
            ("map_full", map),
            ("read_fail", 0),
            ("stack_copy_fail", 0),
        ]
    }

    #[test]
    fn only_a_full_ring_buffer_is_told_to_grow_it() {
        let zero = counts(0, 0, 0);
        let w = warning(&counts(5, 0, 0), &zero).unwrap();
        assert!(
            w.contains("ringbuf_full=5") && w.contains("--buffer-size"),
            "{w}"
        );

        let w = warning(&counts(0, 0, 7), &zero).unwrap();
        assert!(!w.contains("--buffer-size"), "{w}");
        assert!(
            w.contains("map_full=7") && w.contains("fewer keys") && w.contains("-i"),
            "{w}"
        );

        let w = warning(&counts(0, 3, 0), &zero).unwrap();
        assert!(!w.contains("--buffer-size"), "{w}");
        assert!(
            w.contains("stack_fail=3") && w.contains("stack map is full or two stacks collided"),
            "{w}"
        );
    }

    #[test]
    fn advice_for_the_reasons_that_grew_only() {
        let w = warning(&counts(5, 4, 0), &counts(5, 1, 0)).unwrap();
        assert!(
            w.starts_with("memtrace: warning: 9 events lost so far; "),
            "{w}"
        );
        assert!(w.contains("stack_fail=4"), "{w}");
        assert!(!w.contains("ringbuf_full"), "{w}");
        assert_eq!(warning(&counts(5, 4, 0), &counts(5, 4, 0)), None);
        assert_eq!(warning(&counts(0, 0, 0), &counts(0, 0, 0)), None);
    }
}
