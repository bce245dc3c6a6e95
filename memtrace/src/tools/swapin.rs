//! `memtrace swapin`: swap-ins by process per interval (swapin.bt). Only a
//! kprobe or fentry on the swap read function sees them; there is no
//! tracepoint, and major faults are not a substitute, so without either the
//! tool refuses to run.

use std::collections::HashMap;
use std::time::Duration;

use aya::maps::PerCpuHashMap;
use memtrace_common::faults::FaultVal;

use crate::attach::Probe;
use crate::error::{Error, Result};
use crate::output::{clock, Col, Printer, Row};
use crate::run::{Prep, Tool};
use crate::session::Session;
use crate::tools::comm;

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
        let map = s
            .bpf
            .map_mut("SWAPINS")
            .ok_or_else(|| Error::Runtime("SWAPINS map missing".into()))?;
        let mut m: PerCpuHashMap<_, u32, FaultVal> =
            PerCpuHashMap::try_from(map).map_err(|e| Error::Runtime(e.to_string()))?;
        let mut agg: HashMap<u32, (u64, String)> = HashMap::new();
        for item in m.iter() {
            let Ok((pid, vals)) = item else { continue };
            let e = agg.entry(pid).or_default();
            for v in vals.iter() {
                e.0 += v.count;
                if e.1.is_empty() {
                    e.1 = comm(&v.comm);
                }
            }
        }
        for k in agg.keys() {
            let _ = m.remove(k);
        }
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
