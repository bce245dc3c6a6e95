//! `memtrace swapin`: swap-ins by process per interval (swapin.bt). Only a
//! kprobe or fentry on the swap read function sees them; there is no
//! tracepoint, and major faults are not a substitute, so without either the
//! tool refuses to run.

use std::time::Duration;

use memtrace_common::names::{SWAPINS, SWAPIN_FENTRY, SWAPIN_KPROBE};

use crate::error::Result;
use crate::output::{clock, Col, Printer, Row};
use crate::run::args::IntervalArgs;
use crate::run::tool::{About, Prep, Tool};
use crate::session::attach::Probe;
use crate::session::records::comm;
use crate::stacks::Traced;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::run::args::Common,
    #[command(flatten)]
    pub interval: IntervalArgs,
}

pub fn probes() -> Vec<Probe> {
    // The swap read function was renamed in 6.6.
    vec![Probe::new("swap-ins")
        .kprobe(SWAPIN_KPROBE, "swap_read_folio")
        .kprobe(SWAPIN_KPROBE, "swap_readpage")
        .fentry(SWAPIN_FENTRY, "swap_read_folio")
        .fentry(SWAPIN_FENTRY, "swap_readpage")]
}

pub struct Swapin {
    args: Args,
    total: u64,
}

impl Swapin {
    pub fn new(a: &Args) -> Result<Self> {
        Ok(Swapin {
            args: a.clone(),
            total: 0,
        })
    }
}

pub const ABOUT: About = About {
    name: "swapin",
    help: "Swap-ins by process (needs kprobe or fentry)",
    traces: "swap-ins",
    interval: Some(Duration::from_secs(1)),
};

impl Tool for Swapin {
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
        k.loader.max_entries(SWAPINS, 8192);
        Ok(())
    }

    fn report(&mut self, s: &mut Traced, out: &mut dyn Printer, clear: bool) -> Result<()> {
        let mut v = s.read_counts(SWAPINS, clear)?;
        v.sort_by_key(|e| std::cmp::Reverse(e.1.count));
        // A report that does not clear (SIGUSR1) shows counts the next one
        // shows again.
        if clear {
            self.total += v.iter().map(|x| x.1.count).sum::<u64>();
        }
        let cols = [
            Col::num("pid", "PID", 7),
            Col::text("comm", "COMM", 16),
            Col::num("swapins", "SWAPINS", 9),
        ];
        let rows: Vec<Row> = v
            .into_iter()
            .map(|(k, val)| {
                Row(vec![
                    k.tgid.into(),
                    comm(&val.comm).into(),
                    val.count.into(),
                ])
            })
            .collect();
        out.table("swapin", &clock(), &cols, &rows);
        Ok(())
    }

    fn events(&self) -> u64 {
        self.total
    }
}
