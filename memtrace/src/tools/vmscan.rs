//! `memtrace vmscan [INTERVAL [COUNT]]`: the reclaim dashboard of bpftrace's
//! vmscan.bt, one row per interval, with times measured in the kernel.

use std::time::Duration;

use aya::maps::PerCpuArray;
use memtrace_common::reclaim::{
    total, ProcReclaimKey, ProcReclaimVal, ReclaimConfig, ReclaimTotals, KIND_DIRECT,
};

use crate::attach::Probe;
use crate::error::{Error, Result};
use crate::output::{clock, Col, Printer, Row, Value};
use crate::run::{Prep, Tool};
use crate::session::Session;
use crate::tools::first_comm;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::cli::Common,
    /// Seconds between rows.
    #[arg(default_value = "1", value_parser = crate::cli::parse_duration)]
    pub interval: Duration,
    /// Number of rows, then exit.
    pub count: Option<u64>,
    /// Split direct and memcg reclaim time by the process that stalled.
    #[arg(short = 'P', long)]
    pub per_process: bool,
}

/// Reclaim begin/end pairs: shared with drsnoop.
pub fn reclaim_probes() -> Vec<Probe> {
    vec![
        Probe::new("direct reclaim begin").tracepoint(
            "direct_reclaim_begin",
            "vmscan",
            "mm_vmscan_direct_reclaim_begin",
        ),
        Probe::new("direct reclaim end").tracepoint(
            "reclaim_end",
            "vmscan",
            "mm_vmscan_direct_reclaim_end",
        ),
        Probe::new("memcg reclaim begin")
            .tracepoint(
                "memcg_reclaim_begin",
                "vmscan",
                "mm_vmscan_memcg_reclaim_begin",
            )
            .optional(),
        Probe::new("memcg reclaim end")
            .tracepoint("reclaim_end", "vmscan", "mm_vmscan_memcg_reclaim_end")
            .optional(),
    ]
}

pub fn probes() -> Vec<Probe> {
    let mut p = reclaim_probes();
    p.extend([
        Probe::new("slab shrink start")
            .tracepoint("shrink_slab_start", "vmscan", "mm_shrink_slab_start")
            .optional(),
        Probe::new("slab shrink end")
            .tracepoint("shrink_slab_end", "vmscan", "mm_shrink_slab_end")
            .optional(),
        Probe::new("kswapd wakeups")
            .tracepoint("kswapd_wake", "vmscan", "mm_vmscan_kswapd_wake")
            .optional(),
        // Renamed in 6.x: both names are tried.
        Probe::new("reclaim writeback")
            .tracepoint("reclaim_write", "vmscan", "mm_vmscan_write_folio")
            .tracepoint("reclaim_write", "vmscan", "mm_vmscan_writepage")
            .optional(),
    ]);
    p
}

/// Sets RECLAIM_CFG for vmscan and drsnoop.
pub fn prepare_reclaim(k: &mut Prep, cfg: ReclaimConfig) -> Result<()> {
    let f = k.format("vmscan", "mm_vmscan_direct_reclaim_end")?;
    let cfg = ReclaimConfig {
        tp_nr_reclaimed: f.offset("nr_reclaimed")?,
        ..cfg
    };
    k.loader.global("RECLAIM_CFG", &cfg);
    k.loader.max_entries("RECLAIM_START", 4096);
    k.loader.max_entries("SLAB_START", 4096);
    if cfg.per_process != 0 {
        k.loader.max_entries("PROC_RECLAIM", 4096);
    }
    Ok(())
}

pub fn read_totals(s: &Session) -> Result<[u64; total::NR]> {
    let m = s
        .bpf
        .map("RECLAIM_TOTALS")
        .ok_or_else(|| Error::Runtime("RECLAIM_TOTALS map missing".into()))?;
    let arr: PerCpuArray<_, ReclaimTotals> =
        PerCpuArray::try_from(m).map_err(|e| Error::Runtime(e.to_string()))?;
    let mut sum = [0u64; total::NR];
    if let Ok(vals) = arr.get(&0, 0) {
        for v in vals.iter() {
            for (i, x) in v.v.iter().enumerate() {
                sum[i] += x;
            }
        }
    }
    Ok(sum)
}

pub struct Vmscan {
    args: Args,
    last: [u64; total::NR],
    rows: u64,
}

impl Vmscan {
    pub fn new(a: &Args) -> Result<Self> {
        Ok(Vmscan {
            args: a.clone(),
            last: [0; total::NR],
            rows: 0,
        })
    }

    fn row(&mut self, s: &mut Session, out: &mut dyn Printer) -> Result<()> {
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
        self.rows += 1;
        Ok(())
    }

    fn per_process(&self, s: &mut Session, out: &mut dyn Printer) -> Result<()> {
        let agg: Vec<(ProcReclaimKey, (u64, u64, u64, String))> = s
            .read_percpu::<ProcReclaimKey, ProcReclaimVal>("PROC_RECLAIM", true)?
            .into_iter()
            .map(|(k, vals)| {
                let ns = vals.iter().map(|v| v.ns).sum();
                let stalls = vals.iter().map(|v| v.stalls).sum();
                let pages = vals.iter().map(|v| v.pages).sum();
                (
                    k,
                    (ns, stalls, pages, first_comm(vals.iter().map(|v| &v.comm))),
                )
            })
            .collect();
        if agg.is_empty() {
            return Ok(());
        }
        let mut v: Vec<_> = agg.into_iter().collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.1 .0));
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
            .map(|(k, (ns, st, pg, c))| {
                Row(vec![
                    k.tgid.into(),
                    c.into(),
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

impl Tool for Vmscan {
    fn name(&self) -> &'static str {
        "vmscan"
    }
    fn what(&self) -> String {
        "reclaim".into()
    }
    fn probes(&self) -> Vec<Probe> {
        probes()
    }
    fn interval(&self) -> Option<Duration> {
        Some(self.args.interval)
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

    fn on_interval(&mut self, s: &mut Session, out: &mut dyn Printer) -> Result<bool> {
        self.row(s, out)?;
        Ok(self.args.count.is_none_or(|c| self.rows < c))
    }

    fn events(&self) -> u64 {
        self.last[total::DIRECT_STALLS] + self.last[total::MEMCG_STALLS]
    }
}
