//! What a tool is: its probes, what it asks of the kernel programs, how it
//! aggregates and reports. `run` drives every tool through the same life
//! cycle; a counting tool only writes `report`.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use crate::error::Result;
use crate::output::{Printer, Value};
use crate::run::args::IntervalArgs;
use crate::session::attach::Probe;
use crate::session::Fold;
use crate::stacks::args::StackArgs;
use crate::stacks::Traced;

/// What a tool is, declared once in its file (`pub const ABOUT`): the
/// command list takes its subcommand and help from it, and the run its
/// banner and default interval.
pub struct About {
    /// The subcommand.
    pub name: &'static str,
    /// One line for `memtrace --help`.
    pub help: &'static str,
    /// "OOM kills", for the banner "Tracing OOM kills..." (a tool whose
    /// banner depends on its arguments says it in `what`).
    pub traces: &'static str,
    /// The interval when none is given: dashboards print every second.
    pub interval: Option<Duration>,
}

/// One tool: its probes, its aggregation, its report.
pub trait Tool {
    fn about(&self) -> &'static About;
    fn name(&self) -> &'static str {
        self.about().name
    }
    fn what(&self) -> String {
        self.about().traces.into()
    }
    fn probes(&self) -> Vec<Probe>;
    /// `stack_mode` bits the kernel programs should capture.
    fn stack_mode(&self) -> u32 {
        0
    }
    /// The user-stack arguments, for tools that print user stacks, and
    /// whether the tool's events are rare enough to copy every stack.
    fn user_stacks(&self) -> Option<(&StackArgs, bool)> {
        None
    }
    /// `--top N` of tools that print stacks, as given: applied after
    /// identical stacks of several processes are merged, not before, and
    /// what it leaves out is said (`Printer::rest`).
    fn top(&self) -> Option<usize> {
        None
    }
    /// The stacks (or rows) a text report shows when no `--top` is given.
    fn text_top(&self) -> usize {
        crate::output::TEXT_TOP
    }
    /// Sets the globals and map sizes the tool's programs need.
    fn prepare(&mut self, k: &mut Prep) -> Result<()>;
    /// Variables added to a `-c` command's environment.
    fn command_env(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// `-i`/`--count` (or `INTERVAL [COUNT]`) of tools that report per interval.
    fn intervals(&self) -> Option<&IntervalArgs> {
        None
    }
    /// The interval when none is given (`About::interval`, unless the
    /// arguments say otherwise).
    fn default_interval(&self) -> Option<Duration> {
        self.about().interval
    }
    /// Once attached, before the banner: initial state the kernel needs.
    fn on_start(&mut self, _s: &mut Traced) -> Result<()> {
        Ok(())
    }
    /// A ring-buffer record.
    fn on_record(&mut self, _data: &[u8], _s: &mut Traced, _out: &mut dyn Printer) -> Result<()> {
        Ok(())
    }
    /// Reports what the kernel counted; with `clear` the counts start afresh
    /// (interval reports). Counting tools implement only this.
    fn report(&mut self, _s: &mut Traced, _out: &mut dyn Printer, _clear: bool) -> Result<()> {
        Ok(())
    }
    /// Every second or so when no interval reports clear the kernel's maps:
    /// counting tools move what the kernel counted into their own totals,
    /// so a long run never fills a map (processes come and go all day).
    /// Returns how many keys it moved.
    fn drain(&mut self, _s: &mut Traced) -> Result<usize> {
        Ok(0)
    }
    /// Every second or so, intervals or not: the tool lets go of what the
    /// kernel keeps for processes that exited (a long run meets thousands).
    /// Returns how many keys it moved.
    fn forget_exited(&mut self, _s: &mut Traced) -> Result<usize> {
        Ok(0)
    }
    /// Every interval.
    fn on_interval(&mut self, s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        self.report(s, out, true)
    }
    /// SIGUSR1: a report now, without ending the run or clearing counts.
    fn on_mark(&mut self, s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        self.report(s, out, false)
    }
    /// The final report: what is left since the last interval, or everything.
    fn finish(&mut self, s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        let per_interval = self.interval().is_some();
        self.report(s, out, per_interval)
    }
    /// A descriptor that turns readable when the tool has work outside its
    /// records and intervals (kernel notifiers it armed, its own timers):
    /// `on_wakeup` is called then.
    fn wakeup_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    fn on_wakeup(&mut self, _s: &mut Traced, _out: &mut dyn Printer) -> Result<()> {
        Ok(())
    }
    /// The tool saw what the run was for (`--fail` after a warning): end it.
    fn done(&self) -> bool {
        false
    }
    /// Events seen, for the summary.
    fn events(&self) -> u64;
    fn summary_extra(&self) -> Vec<(&'static str, Value)> {
        Vec::new()
    }
    fn exit_code(&self) -> i32 {
        0
    }
    /// Folded stacks asked for.
    fn folded(&self) -> bool {
        false
    }

    /// The interval in force, if any.
    fn interval(&self) -> Option<Duration> {
        self.intervals()
            .and_then(IntervalArgs::every)
            .or(self.default_interval())
    }
}

/// What `Tool::drain` moved out of a kernel count map in runs without `-i`,
/// added back into each report.
pub struct Drained<K, V>(HashMap<K, V>);

impl<K, V> Default for Drained<K, V> {
    fn default() -> Self {
        Drained(HashMap::new())
    }
}

impl<K: Hash + Eq + Copy, V: Fold> Drained<K, V> {
    /// Adds what was just moved out of the map; returns how many keys.
    pub fn add(&mut self, moved: Vec<(K, V)>) -> usize {
        let n = moved.len();
        for (k, v) in moved {
            fold_into(&mut self.0, k, v);
        }
        n
    }

    /// `read` (just read from the map) with all that was drained before;
    /// with `clear` (interval reports) the drained counts go with it.
    pub fn merged(&mut self, read: Vec<(K, V)>, clear: bool) -> Vec<(K, V)> {
        if self.0.is_empty() {
            return read;
        }
        let mut all = if clear {
            std::mem::take(&mut self.0)
        } else {
            self.0.clone()
        };
        for (k, v) in read {
            fold_into(&mut all, k, v);
        }
        all.into_iter().collect()
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.0.values()
    }
}

pub use crate::session::Prep;

fn fold_into<K: Hash + Eq, V: Fold>(to: &mut HashMap<K, V>, k: K, v: V) {
    to.entry(k)
        .and_modify(|e| *e = V::fold(&[*e, v]))
        .or_insert(v);
}

/// The rows a tool's own tables show: `--top` as given, else every row in
/// JSON and folded output and `TEXT_TOP` in text (stacks are cut the same
/// way after merging, by `output::MergedStacks`).
pub fn shown(top: Option<usize>, common: &crate::run::args::Common, folded: bool) -> Option<usize> {
    top.or((!common.json && !folded).then_some(crate::output::TEXT_TOP))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drained_counts_are_in_every_report_until_one_clears() {
        let mut d: Drained<u32, u64> = Drained::default();
        assert_eq!(d.add(vec![(1, 5), (2, 1)]), 2);
        assert_eq!(d.add(vec![(1, 2)]), 1);
        let mut m = d.merged(vec![(1, 1), (3, 4)], false);
        m.sort();
        assert_eq!(m, [(1, 8), (2, 1), (3, 4)]);
        let mut m = d.merged(Vec::new(), true);
        m.sort();
        assert_eq!(m, [(1, 7), (2, 1)]);
        assert_eq!(d.merged(vec![(5, 1)], true), [(5, 1)]);
    }
}
