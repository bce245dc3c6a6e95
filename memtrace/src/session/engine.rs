//! The attach engine: each probe through its fallback chain, first way that
//! works on this kernel wins; every way's reason for failing is kept.

use std::os::fd::AsFd;
use std::path::Path;

use aya::programs::{
    perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
    BtfTracePoint, FEntry, KProbe, PerfEvent, RawTracePoint, TracePoint, UProbe,
};
use aya::util::online_cpus;

use super::{chain, Session};
use crate::error::{Error, Result};
use crate::session::attach::{Method, Probe, Target, Way};
use crate::session::why::{Reasons, WayError};

impl Session {
    /// Attaches `probe` by the first of its ways that works here. Returns the
    /// way used, or `None` for an optional probe nothing could attach.
    pub fn attach(&mut self, probe: &Probe) -> Result<Option<Way>> {
        self.attach_or(probe, false)
    }

    /// As `attach`, but an optional probe the verifier refused is an error
    /// too: with the in-kernel unwinder in, its caller retries the whole
    /// set-up without it (a program whose own stack leaves the unwinder too
    /// little on a kernel before about 6.13) rather than leave the probe
    /// untraced.
    pub fn attach_unless_refused(&mut self, probe: &Probe) -> Result<Option<Way>> {
        self.attach_or(probe, true)
    }

    fn attach_or(&mut self, probe: &Probe, refused_fails: bool) -> Result<Option<Way>> {
        match self.first_way(probe) {
            Ok(way) => Ok(Some(way)),
            Err(reasons) if probe.required || (refused_fails && reasons.refused()) => {
                Err(Error::Unsupported {
                    what: probe.what.to_string(),
                    reasons: reasons.to_string(),
                })
            }
            Err(reasons) => {
                say!("memtrace: warning: {} not traced: {reasons}", probe.what);
                Ok(None)
            }
        }
    }

    /// The way that attached, or every way's reason for failing.
    pub fn first_way(&mut self, probe: &Probe) -> std::result::Result<Way, Reasons> {
        let mut reasons = Vec::new();
        let candidates: Vec<Way> = probe.candidates(self.forced).into_iter().cloned().collect();
        if candidates.is_empty() {
            let m = self.forced.map(|m| m.name()).unwrap_or("?");
            reasons.push((
                String::new(),
                WayError::Unavailable(format!("it cannot be attached by {m} (forced by --attach)")),
            ));
        }
        for way in candidates {
            match self.try_way(&way) {
                Ok(()) => {
                    if self.verbose {
                        say!(
                            "memtrace: {}: attached {} {} (program {})",
                            probe.what,
                            way.method,
                            way.target,
                            way.prog.0
                        );
                    }
                    self.attached.push((
                        probe.what.to_string(),
                        way.method.name().to_string(),
                        way.target.to_string(),
                    ));
                    return Ok(way);
                }
                Err(why) => {
                    if self.verbose {
                        say!(
                            "memtrace: {}: {} {} failed: {}",
                            probe.what,
                            way.method,
                            way.target,
                            why.brief(true)
                        );
                    }
                    reasons.push((format!("{} {}", way.method, way.target), why));
                }
            }
        }
        Err(Reasons {
            ways: reasons,
            verbose: self.verbose,
        })
    }

    fn try_way(&mut self, way: &Way) -> std::result::Result<(), WayError> {
        if let Some((_, why)) = self.ruled_out.iter().find(|(p, _)| *p == way.prog.0) {
            return Err(WayError::Unavailable(why.clone()));
        }
        precheck(way)?;
        if let Target::UserSet { path, points, pid } = &way.target {
            return self.try_user_set(way, path, points, *pid);
        }
        let first = self.loaded.insert(way.prog.0);
        let btf = match way.method {
            Method::Fentry | Method::TpBtf if first => Some(self.btf()?.clone()),
            _ => None,
        };
        let prog = self.bpf.program_mut(way.prog.0).ok_or_else(|| {
            WayError::Failed(format!("program {} missing from the object", way.prog.0))
        })?;
        let e = |e: &dyn std::error::Error| WayError::Failed(chain(e));
        // A program that loaded and failed to attach stays loaded for the
        // next way (kprobe, tracepoint: the target is given at attach);
        // `load_err` marks it not loaded.
        let mut load_failed = false;
        let mut load_err = |x: aya::programs::ProgramError| {
            load_failed = true;
            WayError::load(x)
        };
        let res: std::result::Result<(), WayError> = (|| {
            // A program whose target is bound at load (fentry, tp_btf):
            // attached, its link kept; refused, unloaded, so that another
            // way loads it for its own target.
            macro_rules! attach_bound {
                ($p:expr) => {
                    match $p.attach() {
                        Ok(id) => self
                            .links
                            .push(Box::new($p.take_link(id).map_err(|x| e(&x))?)),
                        Err(x) => {
                            if first {
                                let _ = $p.unload();
                            }
                            return Err(e(&x));
                        }
                    }
                };
            }
            match (way.method, &way.target) {
                (Method::Kprobe, Target::Func(f)) => {
                    let p: &mut KProbe = prog.try_into().map_err(|x| e(&x))?;
                    if first {
                        p.load().map_err(&mut load_err)?;
                    }
                    let id = p.attach(f.as_ref(), 0).map_err(|x| e(&x))?;
                    self.links
                        .push(Box::new(p.take_link(id).map_err(|x| e(&x))?));
                }
                (Method::Fentry, Target::Func(f)) => {
                    let p: &mut FEntry = prog.try_into().map_err(|x| e(&x))?;
                    if let Some(btf) = &btf {
                        p.load(f.as_ref(), btf).map_err(&mut load_err)?;
                    }
                    attach_bound!(p);
                }
                (Method::TpBtf, Target::Tp(_, n)) => {
                    let p: &mut BtfTracePoint = prog.try_into().map_err(|x| e(&x))?;
                    if let Some(btf) = &btf {
                        p.load(n.as_ref(), btf).map_err(&mut load_err)?;
                    }
                    attach_bound!(p);
                }
                (Method::RawTp, Target::Tp(_, n)) => {
                    let p: &mut RawTracePoint = prog.try_into().map_err(|x| e(&x))?;
                    if first {
                        p.load().map_err(&mut load_err)?;
                    }
                    let id = p.attach(n.as_ref()).map_err(|x| e(&x))?;
                    self.links
                        .push(Box::new(p.take_link(id).map_err(|x| e(&x))?));
                }
                (Method::Tracepoint, Target::Tp(c, n)) => {
                    let p: &mut TracePoint = prog.try_into().map_err(|x| e(&x))?;
                    if first {
                        p.load().map_err(&mut load_err)?;
                    }
                    if way.cookie == 0 {
                        let id = p.attach(c.as_ref(), n.as_ref()).map_err(|x| e(&x))?;
                        self.links
                            .push(Box::new(p.take_link(id).map_err(|x| e(&x))?));
                    } else {
                        let fd = p.fd().map_err(|x| e(&x))?;
                        let links = super::cookie::attach_tracepoint(fd.as_fd(), c, n, way.cookie)?;
                        self.raw_links.extend(links);
                    }
                }
                (Method::Perf, Target::PageFaults) => {
                    let p: &mut PerfEvent = prog.try_into().map_err(|x| e(&x))?;
                    if first {
                        p.load().map_err(&mut load_err)?;
                    }
                    let cpus = online_cpus().map_err(|(_, x)| WayError::Failed(x.to_string()))?;
                    for cpu in cpus {
                        let id = p
                            .attach(
                                PerfEventConfig::Software(SoftwareEvent::PageFaults),
                                PerfEventScope::AllProcessesOneCpu { cpu },
                                SamplePolicy::Period(1),
                                true,
                            )
                            .map_err(|x| e(&x))?;
                        self.links
                            .push(Box::new(p.take_link(id).map_err(|x| e(&x))?));
                    }
                }
                (Method::Uprobe | Method::Uretprobe, Target::User { path, offset, pid }) => {
                    let p: &mut UProbe = prog.try_into().map_err(|x| e(&x))?;
                    if first {
                        p.load().map_err(&mut load_err)?;
                    }
                    let scope = match pid.and_then(std::num::NonZeroU32::new) {
                        Some(pid) => UProbeScope::OneProcess(pid),
                        None => UProbeScope::AllProcesses,
                    };
                    let point = UProbeAttachPoint {
                        location: UProbeAttachLocation::AbsoluteOffset(*offset),
                        cookie: (way.cookie != 0).then_some(way.cookie),
                    };
                    let id = p.attach(point, path.as_ref(), scope).map_err(|x| e(&x))?;
                    self.links
                        .push(Box::new(p.take_link(id).map_err(|x| e(&x))?));
                }
                _ => return Err(WayError::Failed("method does not fit target".into())),
            }
            Ok(())
        })();
        if load_failed && first {
            // Nothing loaded; let another way load it again.
            self.loaded.remove(way.prog.0);
        }
        res.map_err(|m| explain(way, m))
    }
}

impl Session {
    /// A set of points in one object: one session link, or a uprobe (and
    /// with `way.ret` a uretprobe) at each.
    fn try_user_set(
        &mut self,
        way: &Way,
        path: &str,
        points: &[(u64, u64)],
        pid: Option<u32>,
    ) -> std::result::Result<(), WayError> {
        if let Some(kind) = super::multi::Kind::of(way.method) {
            let prog = super::multi::load_prog(&self.bpf, way.prog.0, kind)?;
            let link = super::multi::attach(&prog, kind, path, points, pid)?;
            self.raw_links.push(link);
            self.raw_progs.push(prog);
            return Ok(());
        }
        if way.method != Method::Uprobe {
            return Err(WayError::Failed("method does not fit target".into()));
        }
        let scope = match pid.and_then(std::num::NonZeroU32::new) {
            Some(pid) => UProbeScope::OneProcess(pid),
            None => UProbeScope::AllProcesses,
        };
        // Each point's entry program: one reading its cookie, or without
        // cookies the one that knows it; then the returns' program.
        let cookies = crate::kernel::feature::attach_cookies();
        let mut runs: Vec<(memtrace_common::names::Prog, Vec<(u64, u64)>)> = Vec::new();
        for &(offset, cookie) in points {
            let prog = match cookies || way.by_cookie.is_empty() {
                true => way.prog,
                false => way
                    .by_cookie
                    .iter()
                    .find(|(c, _)| *c == cookie)
                    .map(|(_, p)| *p)
                    .ok_or_else(|| {
                        WayError::Unavailable(format!(
                            "no program for cookie {cookie} on a kernel without attach cookies"
                        ))
                    })?,
            };
            match runs.iter_mut().find(|(p, _)| *p == prog) {
                Some((_, at)) => at.push((offset, cookie)),
                None => runs.push((prog, vec![(offset, cookie)])),
            }
        }
        let all: Vec<(u64, u64)> = points.iter().map(|&(o, _)| (o, 0)).collect();
        runs.extend(way.ret.map(|r| (r, all)));
        for (prog, points) in &runs {
            let p: &mut UProbe = self
                .bpf
                .program_mut(prog.0)
                .ok_or_else(|| {
                    WayError::Failed(format!("program {} missing from the object", prog.0))
                })?
                .try_into()
                .map_err(|x| WayError::Failed(chain(&x)))?;
            if self.loaded.insert(prog.0) {
                if let Err(x) = p.load() {
                    self.loaded.remove(prog.0);
                    return Err(WayError::load(x));
                }
            }
            for &(offset, cookie) in points {
                let point = UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(offset),
                    cookie: (cookies && cookie != 0).then_some(cookie),
                };
                let id = p
                    .attach(point, path, scope)
                    .map_err(|x| WayError::Failed(chain(&x)))?;
                self.links.push(Box::new(
                    p.take_link(id).map_err(|x| WayError::Failed(chain(&x)))?,
                ));
            }
        }
        Ok(())
    }
}

/// Cheap checks that give a clearer reason than the load error would.
fn precheck(way: &Way) -> std::result::Result<(), WayError> {
    let no = |why: String| Err(WayError::Unavailable(why));
    match (way.method, &way.target) {
        (Method::Kprobe, _) if !Path::new("/sys/bus/event_source/devices/kprobe/type").exists() => {
            no("the kernel has no kprobes (CONFIG_KPROBES is off)".into())
        }
        (Method::Tracepoint, Target::Tp(c, n)) if !crate::kernel::tracefs::exists(c, n) => {
            no("no such tracepoint on this kernel".into())
        }
        (Method::Fentry, Target::Func(f)) => {
            let btf = match crate::kernel::KernelBtf::shared() {
                Ok(b) => b,
                Err(e) => return no(e.to_string()),
            };
            let Some(id) = btf.func_id(f) else {
                return no(format!("no function {f} in kernel BTF"));
            };
            // Only a refusal of fentry itself is taken from the probe: 5.10
            // refused it now and then with a bare EINVAL (twice in a row,
            // the second time asked for a log, which stayed empty) on
            // functions whose real program then loaded. The real load
            // decides the rest, with the verifier's log.
            match crate::kernel::feature::fentry_loads(id) {
                Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) => no(
                    format!("the kernel refused to load an fentry program ({e})"),
                ),
                _ => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// Puts the kernel's terse answers into words.
fn explain(way: &Way, e: WayError) -> WayError {
    let msg = e.to_string();
    if way.method != Method::Fentry
        || !(msg.contains("Operation not permitted") || msg.contains("EPERM"))
    {
        return e;
    }
    let what = format!("the kernel refused to load an fentry program ({msg})");
    match e {
        WayError::Refused { log, .. } => WayError::Refused { what, log },
        WayError::Failed(_) => WayError::Failed(what),
        e => e,
    }
}
