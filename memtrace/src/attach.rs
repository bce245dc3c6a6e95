//! Attach with fallback: a probe point lists the ways it can be attached,
//! best first; the session takes the first that works on this kernel.

use std::fmt;

/// How a program is attached, best (richest, cheapest) first in most chains.
/// `--attach` takes the names memtrace prints (`tp_btf`, `raw_tp`,
/// `perf_event`), and the kebab-case spellings too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Method {
    Kprobe,
    Fentry,
    #[value(name = "tp_btf", alias = "tp-btf")]
    TpBtf,
    #[value(name = "raw_tp", alias = "raw-tp")]
    RawTp,
    Tracepoint,
    #[value(name = "perf_event", alias = "perf")]
    Perf,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Kprobe => "kprobe",
            Method::Fentry => "fentry",
            Method::TpBtf => "tp_btf",
            Method::RawTp => "raw_tp",
            Method::Tracepoint => "tracepoint",
            Method::Perf => "perf_event",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A kernel function (kprobe, fentry).
    Func(&'static str),
    /// A tracepoint by category and name (classic, tp_btf and raw use the name).
    Tp(&'static str, &'static str),
    /// The software page-fault perf event on every CPU.
    PageFaults,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Func(n) => f.write_str(n),
            Target::Tp(c, n) => write!(f, "{c}:{n}"),
            Target::PageFaults => f.write_str("software:page-faults"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Way {
    pub method: Method,
    /// Name of the program in the eBPF object.
    pub prog: &'static str,
    pub target: Target,
}

/// A probe point and its fallback chain.
#[derive(Debug, Clone)]
pub struct Probe {
    pub what: &'static str,
    pub ways: Vec<Way>,
    /// When false, failing to attach is reported but does not stop the tool.
    pub required: bool,
}

impl Probe {
    pub fn new(what: &'static str) -> Self {
        Probe {
            what,
            ways: Vec::new(),
            required: true,
        }
    }

    fn way(mut self, method: Method, prog: &'static str, target: Target) -> Self {
        self.ways.push(Way {
            method,
            prog,
            target,
        });
        self
    }

    pub fn kprobe(self, prog: &'static str, func: &'static str) -> Self {
        self.way(Method::Kprobe, prog, Target::Func(func))
    }
    pub fn fentry(self, prog: &'static str, func: &'static str) -> Self {
        self.way(Method::Fentry, prog, Target::Func(func))
    }
    pub fn tp_btf(self, prog: &'static str, cat: &'static str, name: &'static str) -> Self {
        self.way(Method::TpBtf, prog, Target::Tp(cat, name))
    }
    pub fn raw_tp(self, prog: &'static str, cat: &'static str, name: &'static str) -> Self {
        self.way(Method::RawTp, prog, Target::Tp(cat, name))
    }
    pub fn tracepoint(self, prog: &'static str, cat: &'static str, name: &'static str) -> Self {
        self.way(Method::Tracepoint, prog, Target::Tp(cat, name))
    }
    pub fn perf_page_faults(self, prog: &'static str) -> Self {
        self.way(Method::Perf, prog, Target::PageFaults)
    }
    pub fn optional(mut self) -> Self {
        self.required = false;
        self
    }

    /// The same probe point with empty programs (`--floor`): what running
    /// any program there costs, to measure the tools against. Only the
    /// tracepoint methods have one.
    pub fn floor(mut self) -> Self {
        self.ways.retain_mut(|w| {
            w.prog = match w.method {
                Method::RawTp => "floor_raw",
                Method::Tracepoint => "floor_tp",
                _ => return false,
            };
            true
        });
        self
    }

    /// The ways to try, in order, honouring a forced method (`--attach`).
    pub fn candidates(&self, forced: Option<Method>) -> Vec<&Way> {
        self.ways
            .iter()
            .filter(|w| forced.is_none_or(|m| m == w.method))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oom() -> Probe {
        Probe::new("oom kill")
            .kprobe("a", "oom_kill_process")
            .fentry("b", "oom_kill_process")
            .tp_btf("c", "oom", "mark_victim")
            .tracepoint("d", "oom", "mark_victim")
    }

    #[test]
    fn a_floor_keeps_the_tracepoint_ways_with_empty_programs() {
        let f = oom().floor();
        let ways: Vec<_> = f.ways.iter().map(|w| (w.method, w.prog)).collect();
        assert_eq!(ways, vec![(Method::Tracepoint, "floor_tp")]);
        assert_eq!(f.ways[0].target, Target::Tp("oom", "mark_victim"));
    }

    #[test]
    fn ways_are_tried_in_declared_order() {
        let p = oom();
        let order: Vec<Method> = p.candidates(None).iter().map(|w| w.method).collect();
        assert_eq!(
            order,
            [
                Method::Kprobe,
                Method::Fentry,
                Method::TpBtf,
                Method::Tracepoint
            ]
        );
    }

    #[test]
    fn forcing_a_method_keeps_only_it() {
        let p = oom();
        let c = p.candidates(Some(Method::Tracepoint));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].prog, "d");
        assert!(p.candidates(Some(Method::Perf)).is_empty());
    }

    #[test]
    fn attach_option_takes_the_printed_names() {
        use clap::ValueEnum;
        for m in [
            Method::Kprobe,
            Method::Fentry,
            Method::TpBtf,
            Method::RawTp,
            Method::Tracepoint,
            Method::Perf,
        ] {
            assert_eq!(Method::from_str(m.name(), false), Ok(m));
        }
        assert_eq!(Method::from_str("tp-btf", false), Ok(Method::TpBtf));
    }
}
