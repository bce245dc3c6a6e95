//! Why a way of attaching a probe did not work, typed: a program the
//! kernel refused keeps the verifier's log apart from the error (from
//! aya's `LoadError`, not parsed out of its text), so that a report can
//! give the first line and `-v` the log's end, where it says why.

use std::fmt;

/// Lines of a refused program's verifier log that `-v` shows (the whole
/// log of a large program is megabytes).
const LOG_TAIL: usize = 12;

#[derive(Debug, thiserror::Error)]
pub enum WayError {
    /// Not tried: the kernel lacks what it needs, or `--attach` ruled it
    /// out.
    #[error("{0}")]
    Unavailable(String),
    /// The kernel refused to load the program.
    #[error("{what}")]
    Refused { what: String, log: Option<String> },
    /// Loaded, and not attached; or the object does not have it.
    #[error("{0}")]
    Failed(String),
}

impl WayError {
    /// A program load error from aya: refused when the kernel refused it,
    /// with the verifier's log.
    pub fn load(e: aya::programs::ProgramError) -> WayError {
        match e {
            aya::programs::ProgramError::LoadError {
                io_error,
                verifier_log,
            } => WayError::Refused {
                what: format!("the kernel refused the program (BPF_PROG_LOAD: {io_error})"),
                log: Some(verifier_log.to_string()),
            },
            // Failed before the kernel saw it (BTF, relocation, a name).
            other => WayError::Failed(super::chain(&other)),
        }
    }

    pub fn refused(&self) -> bool {
        matches!(self, WayError::Refused { .. })
    }

    /// The error on one line, or with `verbose` with the end of the
    /// verifier's log under it.
    pub fn brief(&self, verbose: bool) -> String {
        match self {
            WayError::Refused {
                what,
                log: Some(log),
            } if verbose => {
                let lines: Vec<&str> = log.trim_end_matches('\0').trim_end().lines().collect();
                if lines.is_empty() {
                    return what.clone();
                }
                let tail = lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n");
                format!("{what}; the verifier's log ends:\n{tail}")
            }
            e => e.to_string(),
        }
    }
}

/// Every way a probe was tried, and why each failed.
#[derive(Debug)]
pub struct Reasons {
    /// (method and target, why).
    pub ways: Vec<(String, WayError)>,
    /// With `-v`: refused programs' logs are shown.
    pub verbose: bool,
}

impl Reasons {
    /// Whether the kernel refused a program (rather than lacking a way).
    pub fn refused(&self) -> bool {
        self.ways.iter().any(|(_, e)| e.refused())
    }
}

impl fmt::Display for Reasons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (way, e)) in self.ways.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            match way.is_empty() {
                true => write!(f, "{}", e.brief(self.verbose))?,
                false => write!(f, "{way}: {}", e.brief(self.verbose))?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_program_shows_its_log_end_only_with_verbose() {
        let log: String = (0..1000).map(|i| format!("{i}: insn\n")).collect();
        let e = WayError::Refused {
            what: "the kernel refused the program (BPF_PROG_LOAD: E2BIG)".into(),
            log: Some(log),
        };
        assert_eq!(
            e.brief(false),
            "the kernel refused the program (BPF_PROG_LOAD: E2BIG)"
        );
        let v = e.brief(true);
        assert!(v.starts_with("the kernel refused the program (BPF_PROG_LOAD: E2BIG); the verifier's log ends:\n988: insn"));
        assert!(
            v.ends_with("999: insn") && !v.contains("\n987: insn"),
            "{v}"
        );
        assert_eq!(v.lines().count(), 13, "{v}");
        let r = Reasons {
            ways: vec![
                (
                    "kprobe f".into(),
                    WayError::Unavailable("no kprobes".into()),
                ),
                ("tracepoint t".into(), e),
            ],
            verbose: false,
        };
        assert!(r.refused());
        assert_eq!(
            r.to_string(),
            "kprobe f: no kprobes; tracepoint t: the kernel refused the program (BPF_PROG_LOAD: E2BIG)"
        );
        assert!(!Reasons {
            ways: vec![("k".into(), WayError::Failed("x".into()))],
            verbose: true
        }
        .refused());
    }
}
