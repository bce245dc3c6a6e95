//! `memtrace swapin`: swap-ins by process per interval (swapin.bt). Only a
//! kprobe or fentry on the swap read function sees them; there is no
//! tracepoint, and major faults are not a substitute, so without either the
//! tool refuses to run.

use std::time::Duration;

use memtrace_common::faults::FaultVal;

use crate::attach::Probe;
use crate::error::Result;
use crate::output::{clock, Col, Printer, Row};
use crate::run::{Prep, Tool};
use crate::session::Session;
use crate::tools::first_comm;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::cli::Common,
    /// Seconds between reports.
    #[arg(default_value = "1", value_parser = crate::cli::parse_duration)]
    pub interval: Duration,
    pub count: Option<u64>,
}

pub fn probes() -> Vec<Probe> {
    vec![Probe::new("swap-ins")
        .kprobe("swapin_kprobe", "swap_read_folio")
        .kprobe("swapin_kprobe", "swap_readpage")
        .fentry("swapin_fentry", "swap_read_folio")
        .fentry("swapin_fentry", "swap_readpage")]
}

pub struct Swapin {
    args: Args,
    total: u64,
    rows: u64,
}

impl Swapin {
    pub fn new(a: &Args) -> Result<Self> {
        Ok(Swapin {
            args: a.clone(),
            total: 0,
            rows: 0,
        })
    }
}

impl Tool for Swapin {
    fn name(&self) -> &'static str {
        "swapin"
    }
    fn what(&self) -> String {
        "swap-ins".into()
    }
    fn probes(&self) -> Vec<Probe> {
        probes()
    }
    fn interval(&self) -> Option<Duration> {
        Some(self.args.interval)
    }
    fn prepare(&mut self, k: &mut Prep) -> Result<()> {
        k.loader.max_entries("SWAPINS", 8192);
        Ok(())
    }

    fn on_interval(&mut self, s: &mut Session, out: &mut dyn Printer) -> Result<bool> {
        let agg: Vec<(u32, (u64, String))> = s
            .read_percpu::<u32, FaultVal>("SWAPINS", true)?
            .into_iter()
            .map(|(pid, vals)| {
                let count = vals.iter().map(|v| v.count).sum();
                (pid, (count, first_comm(vals.iter().map(|v| &v.comm))))
            })
            .collect();
        let mut v: Vec<_> = agg.into_iter().collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.1 .0));
        self.total += v.iter().map(|x| x.1 .0).sum::<u64>();
        let cols = [
            Col::num("pid", "PID", 7),
            Col::text("comm", "COMM", 16),
            Col::num("swapins", "SWAPINS", 9),
        ];
        let rows: Vec<Row> = v
            .into_iter()
            .map(|(p, (c, n))| Row(vec![p.into(), n.into(), c.into()]))
            .collect();
        out.table("swapin", &clock(), &cols, &rows);
        self.rows += 1;
        Ok(self.args.count.is_none_or(|c| self.rows < c))
    }

    fn events(&self) -> u64 {
        self.total
    }
}
