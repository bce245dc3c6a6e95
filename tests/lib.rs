//! memtrace's integration tests: each `[[test]]` in this package runs the
//! built `memtrace` binary (`MEMTRACE_BIN`) on a workload with known counts.
//! Their shared helpers are in `common/`; this library is empty.
