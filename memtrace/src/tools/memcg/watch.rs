//! Watching the groups: the kernel's notifiers armed, and the samples the
//! timeline and the growth of each process come from.

use std::collections::HashMap;
use std::time::Instant;

use memtrace_common::{
    memcg::{MemcgCross, MemcgLine, NO_LINE},
    names,
};

use super::{
    rss, table, Memcg, Sample, ARRIVALS_EVERY, GROWTH_WINDOW, SAMPLE_EVERY, STEP_TENTH, TAGS,
    TAG_ARRIVALS, TAG_EVENTS, TAG_PREKILL, TAG_PRESSURE, TAG_STEP, TAG_TIMER, TAG_USAGE, TIMELINE,
};
use crate::error::Result;
use crate::output::Printer;
use crate::process::cgroup::notify::Poller;
use crate::process::cgroup::{Group, Version};
use crate::stacks::Traced;

impl Memcg {
    /// Arms the kernel's notifiers for each group, and the sampling timer.
    pub(super) fn arm(&mut self) -> Result<()> {
        let mut p = Poller::new()?;
        p.timer(SAMPLE_EVERY, TAG_TIMER)?;
        for (i, w) in self.groups.iter().enumerate() {
            let tag = i as u64 * TAGS;
            // The run-up from events: usage at each tenth of the limit, so
            // a group that fills between two samples shows its climb (v1's
            // notifier; v2 has none for usage).
            if let Some((limit, at)) = w.limit.as_ref().filter(|(_, at)| at.version == Version::V1)
            {
                for tenth in 1..=10 {
                    let step = tag + TAG_STEP + tenth * STEP_TENTH;
                    if let Err(e) = p.v1_threshold(&at.dir(), limit / 10 * tenth, step) {
                        say!("memtrace: {}: usage steps not followed: {e}", w.group.path);
                        break;
                    }
                }
            }
            if let (Some(pct), Some((_, at))) = (self.args.warn, &w.limit) {
                let thr = w.threshold(pct).unwrap_or(0);
                // Armed on the level that sets the limit: its usage is what hits it.
                let armed = match at.version {
                    Version::V1 => p.v1_threshold(&at.dir(), thr, tag + TAG_USAGE),
                    // v2 has no usage notifier: memory.events changes (and
                    // the sampling timer) have usage checked.
                    Version::V2 => p.v2_events(&w.group.dir(), tag + TAG_EVENTS),
                };
                if let Err(e) = armed {
                    say!("memtrace: {}: no usage notifier: {e}", w.group.path);
                }
            }
            if let Some((kind, pct)) = &self.args.warn_pressure {
                if let Err(e) = p.psi_trigger(&w.group.dir(), kind, *pct, tag + TAG_PRESSURE) {
                    say!("memtrace: {}: no PSI trigger: {e}", w.group.path);
                }
            }
        }
        if self.heap.as_ref().is_some_and(|h| h.shimmed_in()) {
            p.timer(ARRIVALS_EVERY, TAG_ARRIVALS)?;
        }
        if let Some(h) = &self.hook {
            use std::os::fd::AsFd;
            p.readable(h.listener.as_fd(), TAG_PREKILL)?;
        }
        self.poller = Some(p);
        Ok(())
    }

    /// Usage crossed a tenth of group `i`'s limit: a point of its run-up.
    /// Each limiting group's line for the kernel: the warning's, and on v2
    /// the run-up's steps (v1's come from the kernel's notifier).
    pub(super) fn set_lines(&mut self, s: &mut Traced) -> Result<()> {
        let page = crate::kernel::btf::page_size();
        for w in &self.groups {
            let Some((limit, at)) = &w.limit else {
                continue;
            };
            let warn = self.args.warn.and_then(|pct| w.threshold(pct));
            let step = match w.group.version {
                Version::V2 => (limit / page / 10).max(1),
                Version::V1 => 0,
            };
            let line = MemcgLine {
                pages: warn.map_or(u64::MAX, |t| t.div_ceil(page)),
                crossed: warn.is_none() as u64,
                step_pages: step,
                next_step: step,
            };
            s.hash_insert(names::MEMCG_LINES, at.id(), line, 0)?;
        }
        Ok(())
    }

    /// A step of the run-up the kernel saw at an allocation (v2).
    pub(super) fn kernel_step(&mut self, ev: &MemcgCross) {
        let usage = ev.usage_pages * crate::kernel::btf::page_size();
        for w in &mut self.groups {
            let Some((limit, at)) = &w.limit else {
                continue;
            };
            if at.id() == ev.limit_id {
                let pct = (usage as u128 * 100 / (*limit).max(1) as u128).min(255) as u8;
                push_step(&mut w.timeline, usage, pct / 10 * 10);
            }
        }
    }

    /// A tenth of the limit crossed, by v1's notifier: the point is at the
    /// line it fired at.
    pub(super) fn step(&mut self, i: usize, tenth: u64) {
        let Some(w) = self.groups.get_mut(i) else {
            return;
        };
        let Some((limit, _)) = &w.limit else { return };
        // The line it crossed: usage read now may be tenths past it.
        push_step(&mut w.timeline, *limit / 10 * tenth, tenth as u8 * 10);
    }

    /// Samples usage and pressure for the timeline, and the RSS of the
    /// processes the kernel follows; refreshes the ids it follows.
    pub(super) fn sample(&mut self, s: &mut Traced) -> Result<()> {
        let now = Instant::now();
        // Each followed group's id, and how many levels up the group that
        // sets its limit is (the kernel checks that one's usage).
        let mut watch = HashMap::new();
        let mut walked = Vec::new();
        for w in &mut self.groups {
            w.timeline.push_back(Sample {
                at: now,
                usage: w.group.usage().unwrap_or(0),
                psi: w.group.psi(),
                step: None,
            });
            while w.timeline.front().is_some_and(|x| now - x.at > TIMELINE) {
                w.timeline.pop_front();
            }
            let all = w.group.with_descendants();
            w.ids = all.iter().map(Group::id).collect();
            for g in &all {
                let up = w.limit.as_ref().map_or(NO_LINE, |(_, at)| {
                    table::levels_up(&g.path, &at.path).min(NO_LINE as u64) as u8
                });
                watch.insert(g.id(), up);
            }
            walked.extend(all);
        }
        if self.runup_events() {
            for (id, up) in &watch {
                s.hash_insert(names::MEMCG_WATCH, *id, *up, 0)?;
            }
            // The groups as walked, for the heap's newcomers.
            self.follow_members(&walked, s)?;
            self.walked = walked;
        }
        if self.warning() {
            for (pid, v) in s.hash_entries(names::MEMCG_PROCS) {
                if !crate::process::proc::alive(pid) {
                    s.hash_remove(names::MEMCG_PROCS, &pid)?;
                    self.rss_history.remove(&pid);
                    continue;
                }
                let h = self.rss_history.entry(pid).or_default();
                h.push_back((now, rss(&v)));
                while h.front().is_some_and(|x| now - x.0 > GROWTH_WINDOW) {
                    h.pop_front();
                }
            }
        }
        Ok(())
    }

    /// What the poller says is ready: notifiers, timers, a prekill call.
    pub(super) fn wakeup(&mut self, s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        let mut tags = self.poller.as_mut().map(Poller::ready).unwrap_or_default();
        // Steps read together go into the run-up lowest first.
        tags.sort_unstable();
        for tag in tags {
            if tag == TAG_PREKILL {
                self.on_prekill(s, out)?;
                continue;
            }
            if tag == TAG_ARRIVALS {
                let walked = std::mem::take(&mut self.walked);
                self.follow_members(&walked, s)?;
                self.walked = walked;
                continue;
            }
            if tag == TAG_TIMER {
                self.sample(s)?;
                // v2 has no usage notifier: usage is checked at each sample too.
                for i in 0..self.groups.len() {
                    if self.groups[i].group.version == Version::V2 {
                        self.check_usage(i, "sample", s, out)?;
                    }
                }
                // The v1 notifier fires at a crossing only: a group over
                // the line already is warned about at the first sample.
                if !self.checked_start {
                    self.checked_start = true;
                    for i in 0..self.groups.len() {
                        if self.over_at_start.get(i) == Some(&true) {
                            self.check_usage(i, "at start", s, out)?;
                        }
                    }
                }
                continue;
            }
            let (tenth, tag) = (tag / STEP_TENTH, tag % STEP_TENTH);
            let i = (tag / TAGS) as usize;
            match tag % TAGS {
                TAG_PRESSURE => self.warn(i, "pressure", None, s, out)?,
                TAG_STEP => self.step(i, tenth),
                TAG_EVENTS => self.check_usage(i, "memory.events", s, out)?,
                _ => self.check_usage(i, "threshold", s, out)?,
            }
        }
        Ok(())
    }
}

/// A point of the run-up at `pct` percent of the limit crossed.
fn push_step(timeline: &mut std::collections::VecDeque<Sample>, usage: u64, pct: u8) {
    timeline.push_back(Sample {
        at: Instant::now(),
        usage,
        psi: None,
        step: Some(pct),
    });
}
