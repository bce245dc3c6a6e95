//! Typed errors of the library. `exit_code` decides what the shell sees:
//! 2 for bad input and for what this kernel or user cannot do, 1 for failures
//! at run time.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("{0}")]
    Usage(String),
    #[error("no process with pid {0}")]
    NoSuchPid(u32),
    /// Names the capabilities missing (see `caps`).
    #[error("memtrace needs root, or CAP_BPF and CAP_PERFMON, to load eBPF programs: missing {0}")]
    MissingCaps(String),
    #[error("tracefs is not available: {0}")]
    NoTracefs(String),
    #[error("kernel BTF is not available ({0}); memtrace needs CONFIG_DEBUG_INFO_BTF")]
    NoBtf(String),
    #[error("tracepoint {category}:{name} does not exist on this kernel")]
    NoTracepoint { category: String, name: String },
    #[error("tracepoint {tracepoint} has no field {field}")]
    NoField { tracepoint: String, field: String },
    /// Offsets a tool's programs read that this kernel's BTF lacks.
    #[error("{what} cannot be resolved: kernel BTF has no {missing}")]
    MissingOffsets { what: String, missing: String },
    /// No way in the fallback chain worked; names what the kernel lacks.
    #[error("cannot trace {what}: {reasons}")]
    Unsupported { what: String, reasons: String },
    #[error("failed to load eBPF object: {0}")]
    Load(String),
    #[error("{0}")]
    Runtime(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Writing the report failed; a closed pipe is not a failure.
    #[error("writing output: {0}")]
    Output(std::io::Error),
}

impl Error {
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Output(_) if self.quiet() => 0,
            Error::Load(_) | Error::Runtime(_) | Error::Io(_) | Error::Output(_) => 1,
            _ => 2,
        }
    }
}

impl Error {
    /// Whoever read the output is gone (`memtrace ... | head`): memtrace
    /// stops, detaches and exits 0 without a word, as `head` users expect.
    pub fn quiet(&self) -> bool {
        matches!(self, Error::Output(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
