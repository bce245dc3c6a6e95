//! `memtrace drsnoop`: one line per direct or memcg reclaim stall, and a
//! latency histogram at the end.

use memtrace_common::{
    kind,
    reclaim::{ReclaimConfig, ReclaimEvent, KIND_DIRECT},
};

use crate::error::Result;
use crate::kernel::cgroupid;
use crate::output::{clock, Col, Hist, Printer, Row, Value};
use crate::probes::reclaim::{prepare_reclaim, reclaim_probes};
use crate::run::tool::{About, Prep, Tool};
use crate::session::attach::Probe;
use crate::session::records::{comm, record};
use crate::stacks::Traced;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::run::args::Common,
    /// Only stalls of at least this many milliseconds.
    #[arg(long = "min-latency", default_value_t = 0.0)]
    pub min_latency_ms: f64,
}

pub fn probes() -> Vec<Probe> {
    reclaim_probes()
}

const COLS: [Col; 7] = [
    Col::text("time", "TIME", 8),
    Col::num("pid", "PID", 7),
    Col::text("comm", "COMM", 16),
    Col::num("lat_ms", "LAT(ms)", 9),
    Col::num("pages", "PAGES", 8),
    Col::text("kind", "KIND", 6),
    Col::text("memcg", "MEMCG", 10),
];

pub struct Drsnoop {
    args: Args,
    stalls: u64,
    hist: Hist,
}

impl Drsnoop {
    pub fn new(a: &Args) -> Result<Self> {
        Ok(Drsnoop {
            args: a.clone(),
            stalls: 0,
            hist: Hist::new("Reclaim stall latency (us):", ""),
        })
    }
}

pub const ABOUT: About = About {
    name: "drsnoop",
    help: "One line per direct or memcg reclaim stall",
    traces: "direct and memcg reclaim stalls",
    interval: None,
};

impl Tool for Drsnoop {
    fn about(&self) -> &'static About {
        &ABOUT
    }
    fn probes(&self) -> Vec<Probe> {
        probes()
    }

    fn prepare(&mut self, k: &mut Prep) -> Result<()> {
        // The memcg of a stall comes from the task's cgroup, read through BTF offsets.
        k.task_offsets()?;
        prepare_reclaim(
            k,
            ReclaimConfig {
                emit_events: 1,
                min_latency_ns: (self.args.min_latency_ms * 1e6) as u64,
                ..Default::default()
            },
        )
    }

    fn on_record(&mut self, data: &[u8], _s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        let Some(ev) = record::<ReclaimEvent>(data, kind::RECLAIM) else {
            return Ok(());
        };
        self.stalls += 1;
        self.hist.add(ev.lat_ns / 1000);
        let memcg = cgroupid::path_of(ev.memcg_id)
            .map(|(_, p)| Value::S(p))
            .unwrap_or(Value::Null);
        let row = Row(vec![
            clock().into(),
            ev.pid.into(),
            comm(&ev.comm).into(),
            Value::F(ev.lat_ns as f64 / 1e6, 3),
            ev.pages.into(),
            if ev.reclaim == KIND_DIRECT {
                "direct"
            } else {
                "memcg"
            }
            .into(),
            memcg,
        ]);
        out.event("reclaim_stall", &COLS, &row);
        Ok(())
    }

    fn finish(&mut self, _s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        if self.hist.total() > 0 {
            out.histogram(&self.hist);
        }
        Ok(())
    }

    fn events(&self) -> u64 {
        self.stalls
    }
}
