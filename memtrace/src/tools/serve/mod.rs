//! `memtrace serve`: the `top` counters kept attached and exposed to
//! Prometheus as OpenMetrics text on /metrics, per process (the busiest
//! `--max-series`, the rest as "other") and per memory cgroup.

mod http;
mod metrics;
mod series;

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::output::Printer;
use crate::probes::snapshot::{Counters, Snapshot};
use crate::run::tool::{About, Prep, Tool};
use crate::session::attach::Probe;
use crate::stacks::Traced;

use series::Series;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::run::args::Common,
    /// Address and port to serve /metrics on (`:PORT` is 127.0.0.1:PORT).
    #[arg(long, default_value = "127.0.0.1:9477")]
    pub listen: String,
    /// Processes with series of their own (the busiest); the rest add up in
    /// one "other" series. The same bound applies to cgroups and OOM victims.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub max_series: u32,
    /// How often the counters are read (e.g. 1s, 5s).
    #[arg(short = 'i', long, default_value = "1s", value_parser = crate::run::args::parse_duration)]
    pub interval: Duration,
    /// How long an exited process keeps its series (e.g. 60s).
    #[arg(long, default_value = "60s", value_parser = crate::run::args::parse_duration)]
    pub keep_exited: Duration,
    /// The user serve runs as once everything is attached (a name or a
    /// number): it then holds no capability and owns none of root's files.
    #[arg(long, default_value = "nobody")]
    pub user: String,
}

fn listen_addr(s: &str) -> Result<SocketAddr> {
    let full = if s.starts_with(':') {
        format!("127.0.0.1{s}")
    } else {
        s.to_string()
    };
    full.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| Error::Usage(format!("--listen: '{s}' is not ADDR:PORT")))
}

pub struct Serve {
    args: Args,
    counters: Counters,
    snap: Snapshot,
    procs: Series<u32>,
    cgroups: Series<String>,
    page: Arc<Mutex<String>>,
    listener: Option<TcpListener>,
    /// Where it listens (the port chosen when 0 was asked for).
    addr: SocketAddr,
    pub(crate) state: metrics::State,
    events: u64,
    /// The uid and gid it runs as once attached.
    user: (u32, u32),
}

impl Serve {
    pub fn new(a: &Args) -> Result<Self> {
        let addr = listen_addr(&a.listen)?;
        let user = crate::kernel::caps::user_ids(&a.user)
            .ok_or_else(|| Error::Usage(format!("--user: no user '{}'", a.user)))?;
        // Bound before anything is loaded: a port in use is a usage error
        // (exit 2), said in one line.
        let listener = TcpListener::bind(addr).map_err(|e| {
            let why = match e.kind() {
                std::io::ErrorKind::AddrInUse => "address already in use".to_string(),
                _ => e.to_string(),
            };
            Error::Usage(format!("cannot listen on {addr}: {why}"))
        })?;
        let addr = listener.local_addr().unwrap_or(addr);
        let keep = (a.keep_exited.as_secs_f64() / a.interval.as_secs_f64()).ceil() as u64;
        let max = a.max_series as usize;
        Ok(Serve {
            args: a.clone(),
            counters: Counters,
            snap: Snapshot::new(keep.max(1)),
            procs: Series::new(max),
            cgroups: Series::new(max),
            page: Arc::new(Mutex::new(String::new())),
            listener: Some(listener),
            addr,
            state: metrics::State::new(max),
            events: 0,
            user,
        })
    }

    fn refresh(&mut self, s: &Traced) {
        let tick = self.snap.tick;
        let active: Vec<(u32, _)> = self.snap.procs.values().map(|p| (p.pid, p.last)).collect();
        let procs = &self.snap.procs;
        self.procs
            .update(tick, active, |pid| procs.contains_key(pid));
        let by_cgroup: Vec<(String, _)> = procs
            .values()
            .map(|p| (metrics::cgroup_label(&p.cgroup), p.last))
            .collect();
        self.cgroups.update(tick, by_cgroup, |_| true);
        for k in self.snap.take_ooms() {
            self.state.oom(&k);
        }
        let text = metrics::render(self, s);
        *self.page.lock().unwrap() = text;
    }
}

pub const ABOUT: About = About {
    name: "serve",
    help: "Keep the counters attached and serve them to Prometheus on /metrics",
    traces: "memory activity for Prometheus",
    interval: None,
};

impl Tool for Serve {
    fn about(&self) -> &'static About {
        &ABOUT
    }
    fn what(&self) -> String {
        format!("memory activity for http://{}/metrics", self.addr)
    }
    fn probes(&self) -> Vec<Probe> {
        self.counters.probes()
    }
    fn default_interval(&self) -> Option<Duration> {
        Some(self.args.interval)
    }

    fn prepare(&mut self, k: &mut Prep) -> Result<()> {
        self.counters.prepare(k)
    }

    fn on_start(&mut self, s: &mut Traced) -> Result<()> {
        if self.args.common.pid.is_none() && self.args.common.command.is_none() {
            self.snap.seed_from_proc();
        }
        self.refresh(s);
        // Everything is loaded and attached: what reads network input
        // holds no capability (the event loop needs only its descriptors).
        let keep = crate::kernel::caps::kept_for_map_reads();
        if let Some((_, name)) = keep {
            say!(
                "memtrace: serve: keeping {name} only: before Linux 6.5, reading maps needs it while \
                 kernel.unprivileged_bpf_disabled is set"
            );
        }
        let keep = keep.map_or(0, |k| k.0);
        let (uid, gid) = self.user;
        // Failing closed: a capability-less uid 0 still owns root's files.
        crate::kernel::caps::become_user(uid, gid, keep).map_err(|e| {
            Error::Runtime(format!(
                "serve: cannot become {} (uid {uid}): {e}; --user names another",
                self.args.user
            ))
        })?;
        if self.args.common.verbose {
            say!(
                "memtrace: serve: running as {} (uid {uid}, gid {gid}), no capabilities",
                self.args.user
            );
        }
        if let Some(l) = self.listener.take() {
            http::spawn(l, self.page.clone())
                .map_err(|e| Error::Runtime(format!("serve: cannot start HTTP: {e}")))?;
        }
        Ok(())
    }

    fn on_record(&mut self, data: &[u8], _s: &mut Traced, _out: &mut dyn Printer) -> Result<()> {
        self.counters.on_record(data, &mut self.snap);
        Ok(())
    }

    fn on_interval(&mut self, s: &mut Traced, _out: &mut dyn Printer) -> Result<()> {
        self.events += self.counters.read(s, &mut self.snap)?;
        self.refresh(s);
        Ok(())
    }

    fn on_mark(&mut self, _s: &mut Traced, _out: &mut dyn Printer) -> Result<()> {
        Ok(())
    }

    fn finish(&mut self, _s: &mut Traced, _out: &mut dyn Printer) -> Result<()> {
        Ok(())
    }

    fn events(&self) -> u64 {
        self.events
    }
}
