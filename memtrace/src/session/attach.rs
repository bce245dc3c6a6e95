//! Attach with fallback: a probe point lists the ways it can be attached,
//! best first; the session takes the first that works on this kernel.

use std::borrow::Cow;
use std::fmt;

pub use memtrace_common::names::Prog;
use memtrace_common::names::{FLOOR_RAW, FLOOR_TP};

/// A name in a probe target: mostly literals, built at run time by the
/// generic tools (`count`, `trace`).
pub type Name = Cow<'static, str>;

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
    Uprobe,
    Uretprobe,
    /// One program at a function's entry and return, which at entry can
    /// skip the return (`uprobe_multi` session link, Linux 6.13).
    #[value(name = "uprobe_session", alias = "uprobe-session")]
    UprobeSession,
    /// One program at many points of one object by one link
    /// (`uprobe_multi`, Linux 6.6): one detach for all, where a uprobe
    /// each waits for grace periods each (1.8 s for jemalloc's 14 frees).
    #[value(name = "uprobe_multi", alias = "uprobe-multi")]
    UprobeMulti,
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
            Method::Uprobe => "uprobe",
            Method::Uretprobe => "uretprobe",
            Method::UprobeSession => "uprobe_session",
            Method::UprobeMulti => "uprobe_multi",
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
    Func(Name),
    /// A tracepoint by category and name (classic, tp_btf and raw use the name).
    Tp(Name, Name),
    /// The software page-fault perf event on every CPU.
    PageFaults,
    /// An instruction in an object file, by file offset; for one process
    /// (the kernel puts the breakpoint in no other) or for all.
    User {
        path: Name,
        offset: u64,
        pid: Option<u32>,
    },
    /// Instructions in one object file, each with the cookie its program
    /// reads back: one link for all (session), or one probe each.
    UserSet {
        path: Name,
        points: Vec<(u64, u64)>,
        pid: Option<u32>,
    },
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Func(n) => f.write_str(n),
            Target::Tp(c, n) => write!(f, "{c}:{n}"),
            Target::PageFaults => f.write_str("software:page-faults"),
            Target::User { path, offset, .. } => write!(f, "{path}:{offset:#x}"),
            Target::UserSet { path, points, .. } => {
                write!(f, "{path} at {} points", points.len())
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Way {
    pub method: Method,
    /// The program in the eBPF object.
    pub prog: Prog,
    pub target: Target,
    /// The BPF cookie the program reads back (`bpf_get_attach_cookie`): one
    /// program serving many probe points tells them apart by it. 0 is also
    /// what the program reads without one.
    pub cookie: u64,
    /// For `uprobe` on a `UserSet`: the program for the returns too.
    pub ret: Option<Prog>,
    /// For `uprobe` on a `UserSet` where the kernel has no attach cookies
    /// (before 5.15): the program for the points of each cookie, which
    /// knows it without reading it.
    pub by_cookie: &'static [(u64, Prog)],
}

/// A probe point and its fallback chain.
#[derive(Debug, Clone)]
pub struct Probe {
    pub what: Name,
    pub ways: Vec<Way>,
    /// When false, failing to attach is reported but does not stop the tool.
    pub required: bool,
}

impl Probe {
    pub fn new(what: impl Into<Name>) -> Self {
        Probe {
            what: what.into(),
            ways: Vec::new(),
            required: true,
        }
    }

    fn way(mut self, method: Method, prog: Prog, target: Target) -> Self {
        self.ways.push(Way {
            method,
            prog,
            target,
            cookie: 0,
            ret: None,
            by_cookie: &[],
        });
        self
    }

    pub fn kprobe(self, prog: Prog, func: impl Into<Name>) -> Self {
        self.way(Method::Kprobe, prog, Target::Func(func.into()))
    }
    pub fn fentry(self, prog: Prog, func: impl Into<Name>) -> Self {
        self.way(Method::Fentry, prog, Target::Func(func.into()))
    }
    pub fn tp_btf(self, prog: Prog, cat: impl Into<Name>, name: impl Into<Name>) -> Self {
        self.way(Method::TpBtf, prog, Target::Tp(cat.into(), name.into()))
    }
    pub fn raw_tp(self, prog: Prog, cat: impl Into<Name>, name: impl Into<Name>) -> Self {
        self.way(Method::RawTp, prog, Target::Tp(cat.into(), name.into()))
    }
    pub fn tracepoint(self, prog: Prog, cat: impl Into<Name>, name: impl Into<Name>) -> Self {
        self.way(
            Method::Tracepoint,
            prog,
            Target::Tp(cat.into(), name.into()),
        )
    }
    pub fn perf_page_faults(self, prog: Prog) -> Self {
        self.way(Method::Perf, prog, Target::PageFaults)
    }
    pub fn uprobe(self, prog: Prog, path: impl Into<Name>, offset: u64, pid: Option<u32>) -> Self {
        let path = path.into();
        self.way(Method::Uprobe, prog, Target::User { path, offset, pid })
    }
    pub fn uretprobe(
        self,
        prog: Prog,
        path: impl Into<Name>,
        offset: u64,
        pid: Option<u32>,
    ) -> Self {
        let path = path.into();
        self.way(Method::Uretprobe, prog, Target::User { path, offset, pid })
    }
    /// `enter` at each point and `ret` at its return, by one uprobe
    /// session (program `session`) where the kernel has them, else by a
    /// uprobe and a uretprobe at each.
    /// `by_cookie`: the entry programs for kernels without cookies.
    pub fn uprobe_session(
        mut self,
        session: Option<Prog>,
        (enter, ret, by_cookie): (Prog, Prog, &'static [(u64, Prog)]),
        path: impl Into<Name>,
        points: Vec<(u64, u64)>,
        pid: Option<u32>,
    ) -> Self {
        let path = path.into();
        let target = Target::UserSet { path, points, pid };
        if let Some(session) = session {
            self = self.way(Method::UprobeSession, session, target.clone());
        }
        self = self.way(Method::Uprobe, enter, target);
        if let Some(w) = self.ways.last_mut() {
            w.ret = Some(ret);
            w.by_cookie = by_cookie;
        }
        self
    }
    /// `prog` at each of `points` of one object: by one `uprobe_multi`
    /// link where the kernel has them, else by a uprobe at each.
    pub fn uprobe_multi(
        self,
        prog: Prog,
        path: impl Into<Name>,
        points: Vec<(u64, u64)>,
        pid: Option<u32>,
    ) -> Self {
        let target = Target::UserSet {
            path: path.into(),
            points,
            pid,
        };
        self.way(Method::UprobeMulti, prog, target.clone())
            .way(Method::Uprobe, prog, target)
    }
    /// Sets `cookie` on the ways added so far.
    pub fn cookie(mut self, cookie: u64) -> Self {
        for w in &mut self.ways {
            w.cookie = cookie;
        }
        self
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
                Method::RawTp => FLOOR_RAW,
                Method::Tracepoint => FLOOR_TP,
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
            .kprobe(Prog("a"), "oom_kill_process")
            .fentry(Prog("b"), "oom_kill_process")
            .tp_btf(Prog("c"), "oom", "mark_victim")
            .tracepoint(Prog("d"), "oom", "mark_victim")
    }

    #[test]
    fn a_floor_keeps_the_tracepoint_ways_with_empty_programs() {
        let f = oom().floor();
        let ways: Vec<_> = f.ways.iter().map(|w| (w.method, w.prog)).collect();
        assert_eq!(ways, vec![(Method::Tracepoint, FLOOR_TP)]);
        assert_eq!(
            f.ways[0].target,
            Target::Tp("oom".into(), "mark_victim".into())
        );
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
        assert_eq!(c[0].prog, Prog("d"));
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
