//! `memtrace top`: memory activity by process, refreshed every interval: a
//! full-screen table on a terminal (`ui`), the same table as plain text
//! (or JSON lines) otherwise, so it can be scripted.

mod detail;
mod narrow;
mod table;
mod ui;

use std::io::IsTerminal;
use std::time::Duration;

use crate::error::Result;
use crate::output::{clock, Col, Printer, Row, Value};
use crate::probes::snapshot::{Counters, Snapshot};
use crate::run::args::IntervalArgs;
use crate::run::tool::{About, Prep, Tool};
use crate::session::attach::Probe;
use crate::stacks::Traced;

use table::Filter;
pub use table::SortKey;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::run::args::Common,
    #[command(flatten)]
    pub interval: IntervalArgs,
    /// Refresh every SECS, as procps top's -d (the run's length is
    /// --duration).
    #[arg(short = 'd', value_name = "SECS", value_parser = crate::run::args::parse_duration,
          conflicts_with_all = ["interval", "interval_pos"])]
    pub delay: Option<Duration>,
    /// Stop after this many refreshes (as --count).
    #[arg(short = 'n', conflicts_with_all = ["count", "count_pos"])]
    pub iterations: Option<u64>,
    /// Sort by this column (keys on screen change it).
    #[arg(long, value_enum, default_value_t = SortKey::Faults)]
    pub sort: SortKey,
    /// Show only processes whose name or cgroup contains this, or this pid.
    #[arg(long, default_value = "")]
    pub filter: String,
    /// Rows per refresh in plain-text mode (the screen's height on a terminal).
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// Plain text even on a terminal.
    #[arg(long)]
    pub text: bool,
}

pub struct Top {
    args: Args,
    interval: IntervalArgs,
    counters: Counters,
    snap: Snapshot,
    sort: SortKey,
    filter: Filter,
    target: Option<u32>,
    ui: Option<ui::Screen>,
    /// The stack session of the process opened with Enter.
    detail: Option<detail::Detail>,
    /// Why it could not be opened, if it could not.
    detail_error: Option<(u32, String)>,
    quit: bool,
    events: u64,
}

impl Top {
    pub fn new(a: &Args) -> Result<Self> {
        let mut interval = a.interval.clone();
        if a.delay.is_some() {
            interval.interval = a.delay;
        }
        if a.iterations.is_some() {
            interval.count = a.iterations;
        }
        let full_screen = !a.text
            && !a.common.json
            && std::io::stdout().is_terminal()
            && std::io::stdin().is_terminal();
        Ok(Top {
            args: a.clone(),
            interval,
            counters: Counters,
            // Gone processes stay one more refresh: their last counts show.
            snap: Snapshot::new(2),
            sort: a.sort,
            filter: Filter(a.filter.clone()),
            target: None,
            ui: full_screen.then(ui::Screen::default),
            detail: None,
            detail_error: None,
            quit: false,
            events: 0,
        })
    }

    fn print_text(&mut self, out: &mut dyn Printer) {
        for k in self.snap.take_ooms() {
            const COLS: [Col; 5] = [
                Col::text("time", "TIME", 8),
                Col::num("victim_pid", "VPID", 7),
                Col::text("victim_comm", "VCOMM", 15),
                Col::num("anon_rss_kb", "ANON_KB", 9),
                Col::text("cgroup", "CGROUP", 6),
            ];
            let row = Row(vec![
                clock().into(),
                k.victim_pid.into(),
                k.victim_comm.into(),
                k.anon_rss_kb.into(),
                Value::S(k.cgroup),
            ]);
            out.event("oom_kill", &COLS, &row);
        }
        let procs = table::select(&self.snap, self.sort, &self.filter, self.args.top);
        let secs = self.snap.elapsed.as_secs_f64();
        // The rates' own interval, measured: a late refresh (a loaded host)
        // says so, and rate times interval is the count. Plain text has it
        // once, in the title; JSON in each row.
        let json = self.args.common.json;
        let mut cols = table::COLS.to_vec();
        if json {
            cols.push(Col::num("interval_s", "SECS", 6));
        }
        let rows: Vec<Row> = procs
            .iter()
            .map(|p| {
                let mut r = table::row(&self.snap, p);
                if json {
                    r.0.push(Value::F(secs, 3));
                }
                r
            })
            .collect();
        let title = format!(
            "{} top: {} processes, sorted by {}, rates over {secs:.3} s; {}",
            clock(),
            self.snap.procs.len(),
            self.sort.label(),
            crate::process::proc::memory_line()
        );
        out.table("top", &title, &cols, &rows);
    }
}

impl Top {
    /// Opens or closes the stack session to follow the screen, and draws.
    fn redraw(&mut self) -> Result<()> {
        let Some(ui) = self.ui.as_mut() else {
            return Ok(());
        };
        let want = ui.detail();
        if self.detail.as_ref().map(|d| d.pid) != want {
            self.detail = None;
            self.detail_error = None;
            if let Some(pid) = want {
                let comm = self.snap.procs.get(&pid).map_or("", |p| p.comm.as_str());
                match detail::Detail::open(pid, comm, &self.args.common) {
                    Ok(d) => self.detail = Some(d),
                    Err(e) => self.detail_error = Some((pid, e.to_string())),
                }
            }
        }
        let lines = match (&mut self.detail, &self.detail_error) {
            (Some(d), _) => d.lines(),
            (None, Some((_, e))) => vec![format!("stacks: {e}")],
            _ => Vec::new(),
        };
        ui.draw(&mut self.snap, self.sort, &self.filter, &lines)
    }
}

pub const ABOUT: About = About {
    name: "top",
    help: "Live table of memory activity by process: RSS, faults, brk, mmap, reclaim, OOM kills",
    traces: "memory activity by process",
    interval: Some(Duration::from_secs(1)),
};

impl Tool for Top {
    fn about(&self) -> &'static About {
        &ABOUT
    }
    fn probes(&self) -> Vec<Probe> {
        self.counters.probes()
    }
    fn intervals(&self) -> Option<&IntervalArgs> {
        Some(&self.interval)
    }
    fn prepare(&mut self, k: &mut Prep) -> Result<()> {
        self.target = k.target;
        self.counters.prepare(k)
    }

    fn on_start(&mut self, _s: &mut Traced) -> Result<()> {
        match self.target {
            None => self.snap.seed_from_proc(),
            Some(t) => {
                self.snap.seed(t);
                if self.args.common.children {
                    for c in crate::process::proc::descendants(t) {
                        self.snap.seed(c);
                    }
                }
            }
        }
        Ok(())
    }

    fn on_record(&mut self, data: &[u8], _s: &mut Traced, _out: &mut dyn Printer) -> Result<()> {
        self.counters.on_record(data, &mut self.snap);
        Ok(())
    }

    fn on_interval(&mut self, s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        self.events += self.counters.read(s, &mut self.snap)?;
        if self.ui.is_none() {
            self.print_text(out);
            return Ok(());
        }
        self.redraw()
    }

    fn on_mark(&mut self, _s: &mut Traced, _out: &mut dyn Printer) -> Result<()> {
        Ok(())
    }

    /// A run that ends between refreshes (its process exited, Ctrl-C, -d)
    /// prints the part-interval since the last, so that every counted
    /// event is in a refresh; the screen is just left.
    fn finish(&mut self, s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        match self.ui.as_mut() {
            Some(ui) => {
                ui.leave();
                Ok(())
            }
            None => self.on_interval(s, out),
        }
    }

    fn wakeup_fd(&self) -> Option<std::os::fd::RawFd> {
        self.ui.as_ref().map(|_| libc::STDIN_FILENO)
    }

    fn on_wakeup(&mut self, _s: &mut Traced, _out: &mut dyn Printer) -> Result<()> {
        let Some(ui) = self.ui.as_mut() else {
            return Ok(());
        };
        let act = ui.keys(&mut self.sort, &mut self.filter)?;
        if act.quit {
            self.quit = true;
            self.detail = None;
            ui.leave();
        } else if act.redraw {
            self.redraw()?;
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.quit
    }

    fn events(&self) -> u64 {
        self.events
    }
}
