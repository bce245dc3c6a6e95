//! Heap tracking that memleak and memcg's `--heap` share: the allocator
//! entry points of the object a process maps and where each is probed,
//! the kernel's allocator tracepoints, and what is outstanding by stack
//! (with what exited processes and exec'd images held).

pub mod entries;
pub mod execs;
pub mod exited;
pub mod golang;
pub mod injection;
pub mod memo;
pub mod points;
pub mod report;
pub mod safe_dir;
pub mod shim;
pub mod shimmed;
pub mod watch;

/// The preloaded shim's file name starts so: a stack's first frames in it
/// are dropped, so that a stack starts at the allocator's caller, as with
/// uprobes.
pub const SHIM_PREFIX: &str = "memtrace-preload-";

#[cfg(test)]
mod tests {
    use super::points::arena_name;
    use super::report::left_out;

    #[test]
    fn only_allocator_libraries_have_arenas_of_their_own() {
        let je = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
        assert_eq!(arena_name(je).as_deref(), Some("libjemalloc.so.2"));
        assert_eq!(
            arena_name("/usr/lib/libtcmalloc_minimal.so.4").as_deref(),
            Some("libtcmalloc_minimal.so.4")
        );
        // glibc's mmaps of big blocks are the blocks; a static program's
        // own image holds every one of its stacks.
        assert_eq!(arena_name("/usr/lib/x86_64-linux-gnu/libc.so.6"), None);
        assert_eq!(arena_name("/tmp/st"), None);
        assert_eq!(arena_name("/usr/bin/myalloc-demo"), None);
    }

    #[test]
    fn what_is_left_out_is_said_with_its_size() {
        let names = vec!["libjemalloc.so.2".to_string()];
        assert_eq!(left_out((0, 0), &names), "");
        let said = left_out((3, 12 << 20), &names);
        assert!(
            said.contains("12582912 bytes in 3 mappings of libjemalloc.so.2"),
            "{said}"
        );
    }
}
