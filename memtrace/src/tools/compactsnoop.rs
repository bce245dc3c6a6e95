//! `memtrace compactsnoop`: one line per memory compaction run (BCC's
//! compactsnoop): who ran it, on which zone, for which order, how long it
//! took and how it ended, and a latency histogram at the end.

use std::collections::HashMap;

use memtrace_common::{
    compact::{CompactConfig, CompactEvent},
    kind,
    names::{
        COMPACT_BEGIN, COMPACT_CFG, COMPACT_END, COMPACT_ORDER, COMPACT_START, COMPACT_SUITABLE,
    },
};

use crate::error::Result;
use crate::output::{clock, Col, Hist, Printer, Row, Value};
use crate::run::tool::{About, Prep, Tool};
use crate::session::attach::Probe;
use crate::session::records::{comm, record};
use crate::stacks::Traced;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::run::args::Common,
    /// Only runs of at least this many milliseconds.
    #[arg(long = "min-latency", default_value_t = 0.0)]
    pub min_latency_ms: f64,
}

pub fn probes() -> Vec<Probe> {
    vec![
        Probe::new("compaction check").tracepoint(
            COMPACT_SUITABLE,
            "compaction",
            "mm_compaction_suitable",
        ),
        Probe::new("compaction begin").tracepoint(
            COMPACT_BEGIN,
            "compaction",
            "mm_compaction_begin",
        ),
        Probe::new("compaction end").tracepoint(COMPACT_END, "compaction", "mm_compaction_end"),
    ]
}

const COLS: [Col; 8] = [
    Col::text("time", "TIME", 8),
    Col::num("pid", "PID", 7),
    Col::text("comm", "COMM", 16),
    Col::text("zone", "ZONE", 14),
    Col::num("order", "ORDER", 5),
    Col::text("mode", "MODE", 5),
    Col::num("lat_ms", "LAT(ms)", 9),
    Col::text("status", "STATUS", 17),
];

pub struct Compactsnoop {
    args: Args,
    runs: u64,
    hist: Hist,
    /// Zone names by first page frame, from /proc/zoneinfo.
    zones: HashMap<u64, String>,
    /// `enum compact_result` names, from the end tracepoint's format.
    status: HashMap<i64, String>,
}

impl Compactsnoop {
    pub fn new(a: &Args) -> Result<Self> {
        Ok(Compactsnoop {
            args: a.clone(),
            runs: 0,
            hist: Hist::new("Compaction run latency (us):", ""),
            zones: zones(&std::fs::read_to_string("/proc/zoneinfo").unwrap_or_default()),
            status: HashMap::new(),
        })
    }
}

/// "Node 0 DMA32" by each zone's `start_pfn` in /proc/zoneinfo.
fn zones(text: &str) -> HashMap<u64, String> {
    let mut out = HashMap::new();
    let mut zone = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Node ") {
            // "Node 0, zone    DMA32"
            let (node, name) = rest.split_once(", zone").unwrap_or((rest, ""));
            zone = Some(format!("Node {} {}", node.trim(), name.trim()));
        } else if let Some(pfn) = line.trim().strip_prefix("start_pfn:") {
            if let (Some(z), Ok(pfn)) = (zone.take(), pfn.trim().parse()) {
                out.insert(pfn, z);
            }
        }
    }
    out
}

pub const ABOUT: About = About {
    name: "compactsnoop",
    help: "One line per memory compaction run",
    traces: "memory compaction runs",
    interval: None,
};

impl Tool for Compactsnoop {
    fn about(&self) -> &'static About {
        &ABOUT
    }
    fn probes(&self) -> Vec<Probe> {
        probes()
    }

    fn prepare(&mut self, k: &mut Prep) -> Result<()> {
        let begin = k.format("compaction", "mm_compaction_begin")?;
        let end = k.format("compaction", "mm_compaction_end")?;
        let suitable = k.format("compaction", "mm_compaction_suitable")?;
        self.status = end.symbols("status")?.into_iter().collect();
        let cfg = CompactConfig {
            min_latency_ns: (self.args.min_latency_ms * 1e6) as u64,
            tp_begin_zone: begin.offset("zone_start")?,
            tp_begin_sync: begin.offset("sync")?,
            tp_end_status: end.offset("status")?,
            tp_suitable_order: suitable.offset("order")?,
        };
        k.loader.global(COMPACT_CFG, &cfg);
        k.loader.max_entries(COMPACT_START, 4096);
        k.loader.max_entries(COMPACT_ORDER, 4096);
        Ok(())
    }

    fn on_record(&mut self, data: &[u8], _s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        let Some(ev) = record::<CompactEvent>(data, kind::COMPACT) else {
            return Ok(());
        };
        self.runs += 1;
        self.hist.add(ev.lat_ns / 1000);
        let zone = match self.zones.get(&ev.zone_start) {
            Some(z) => z.clone(),
            None => format!("pfn {:#x}", ev.zone_start),
        };
        let status = match self.status.get(&(ev.status as i64)) {
            Some(s) => s.clone(),
            None => ev.status.to_string(),
        };
        let row = Row(vec![
            clock().into(),
            ev.pid.into(),
            comm(&ev.comm).into(),
            zone.into(),
            // Every order: a write to compact_memory.
            if ev.order < 0 {
                Value::Null
            } else {
                (ev.order as u64).into()
            },
            if ev.sync != 0 { "sync" } else { "async" }.into(),
            Value::F(ev.lat_ns as f64 / 1e6, 3),
            status.into(),
        ]);
        out.event("compaction", &COLS, &row);
        Ok(())
    }

    fn finish(&mut self, _s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        if self.hist.total() > 0 {
            out.histogram(&self.hist);
        }
        Ok(())
    }

    fn events(&self) -> u64 {
        self.runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zones_are_named_by_their_first_page_frame() {
        let z = zones(
            "Node 0, zone      DMA\n  pages free     3840\n  start_pfn:           1\n\
             Node 0, zone    DMA32\n  start_pfn:           4096\n\
             Node 0, zone   Normal\n  start_pfn:           1048576\n\
             Node 0, zone  Movable\n  pages free     0\n",
        );
        assert_eq!(z.len(), 3);
        assert_eq!(z[&1], "Node 0 DMA");
        assert_eq!(z[&4096], "Node 0 DMA32");
        assert_eq!(z[&1048576], "Node 0 Normal");
    }
}
