//! `memtrace vmscan [INTERVAL [COUNT]]`: the reclaim dashboard of bpftrace's
//! vmscan.bt, one row per interval, with times measured in the kernel.

use std::time::Duration;

use memtrace_common::names::{
    KSWAPD_WAKE, PROC_RECLAIM, RECLAIM_WRITE, SHRINK_SLAB_END, SHRINK_SLAB_START,
};
use memtrace_common::reclaim::{total, ReclaimConfig, KIND_DIRECT};

use crate::error::Result;
use crate::output::{clock, Col, Printer, Row, Value};
use crate::probes::reclaim::{prepare_reclaim, read_totals, reclaim_probes};
use crate::run::args::IntervalArgs;
use crate::run::tool::{About, Prep, Tool};
use crate::session::attach::Probe;
use crate::session::records::comm;
use crate::stacks::Traced;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::run::args::Common,
    /// Seconds between rows (default 1), and how many.
    #[command(flatten)]
    pub interval: IntervalArgs,
    /// Split direct and memcg reclaim time by the process that stalled.
    #[arg(short = 'P', long)]
    pub per_process: bool,
}

pub fn probes() -> Vec<Probe> {
    let mut p = reclaim_probes();
    p.extend([
        Probe::new("slab shrink start")
            .tracepoint(SHRINK_SLAB_START, "vmscan", "mm_shrink_slab_start")
            .optional(),
        Probe::new("slab shrink end")
            .tracepoint(SHRINK_SLAB_END, "vmscan", "mm_shrink_slab_end")
            .optional(),
        Probe::new("kswapd wakeups")
            .tracepoint(KSWAPD_WAKE, "vmscan", "mm_vmscan_kswapd_wake")
            .optional(),
        // Renamed in 6.x: both names are tried.
        Probe::new("reclaim writeback")
            .tracepoint(RECLAIM_WRITE, "vmscan", "mm_vmscan_write_folio")
            .tracepoint(RECLAIM_WRITE, "vmscan", "mm_vmscan_writepage")
            .optional(),
    ]);
    p
}

pub struct Vmscan {
    args: Args,
    last: [u64; total::NR],
}

impl Vmscan {
    pub fn new(a: &Args) -> Result<Self> {
        Ok(Vmscan {
            args: a.clone(),
            last: [0; total::NR],
        })
    }

    fn row(&mut self, s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        let now = read_totals(s)?;
        let d: Vec<u64> = now.iter().zip(self.last).map(|(a, b)| a - b).collect();
        self.last = now;
        let ms = |ns: u64| Value::F(ns as f64 / 1e6, 2);
        const COLS: [Col; 8] = [
            Col::text("time", "TIME", 8),
            Col::num("slab_ms", "S-SLABms", 9),
            Col::num("direct_reclaim_ms", "D-RECLAIMms", 11),
            Col::num("memcg_reclaim_ms", "M-RECLAIMms", 11),
            Col::num("kswapd_wakeups", "KSWAPD", 7),
            Col::num("writepage", "WRITEPAGE", 9),
            Col::num("direct_pages", "D-PAGES", 8),
            Col::num("memcg_pages", "M-PAGES", 8),
        ];
        let row = Row(vec![
            clock().into(),
            ms(d[total::SLAB_NS]),
            ms(d[total::DIRECT_NS]),
            ms(d[total::MEMCG_NS]),
            d[total::KSWAPD_WAKE].into(),
            d[total::WRITEPAGE].into(),
            d[total::DIRECT_PAGES].into(),
            d[total::MEMCG_PAGES].into(),
        ]);
        out.event("vmscan", &COLS, &row);
        if self.args.per_process {
            self.per_process(s, out)?;
        }
        Ok(())
    }

    fn per_process(&self, s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        let mut v = s.read_counts(PROC_RECLAIM, true)?;
        if v.is_empty() {
            return Ok(());
        }
        v.sort_by_key(|e| std::cmp::Reverse(e.1.ns));
        let cols = [
            Col::num("pid", "PID", 7),
            Col::text("comm", "COMM", 16),
            Col::text("kind", "KIND", 6),
            Col::num("stalls", "STALLS", 7),
            Col::num("ms", "TIMEms", 9),
            Col::num("pages", "PAGES", 8),
        ];
        let rows: Vec<Row> = v
            .into_iter()
            .map(|(k, val)| {
                let (ns, st, pg) = (val.ns, val.stalls, val.pages);
                Row(vec![
                    k.tgid.into(),
                    comm(&val.comm).into(),
                    if k.kind == KIND_DIRECT {
                        "direct"
                    } else {
                        "memcg"
                    }
                    .into(),
                    st.into(),
                    Value::F(ns as f64 / 1e6, 2),
                    pg.into(),
                ])
            })
            .collect();
        out.table("vmscan_process", "", &cols, &rows);
        Ok(())
    }
}

pub const ABOUT: About = About {
    name: "vmscan",
    help: "Reclaim dashboard: slab, direct and memcg reclaim time per interval",
    traces: "reclaim",
    interval: Some(Duration::from_secs(1)),
};

impl Tool for Vmscan {
    fn about(&self) -> &'static About {
        &ABOUT
    }
    fn probes(&self) -> Vec<Probe> {
        probes()
    }
    fn intervals(&self) -> Option<&IntervalArgs> {
        Some(&self.args.interval)
    }
    fn prepare(&mut self, k: &mut Prep) -> Result<()> {
        prepare_reclaim(
            k,
            ReclaimConfig {
                per_process: self.args.per_process as u32,
                ..Default::default()
            },
        )
    }

    fn on_interval(&mut self, s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        self.row(s, out)
    }

    /// A dashboard: rows are whole intervals, none at the end.
    fn finish(&mut self, _s: &mut Traced, _out: &mut dyn Printer) -> Result<()> {
        Ok(())
    }

    fn events(&self) -> u64 {
        self.last[total::DIRECT_STALLS] + self.last[total::MEMCG_STALLS]
    }
}
