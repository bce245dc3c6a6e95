//! `memtrace ffaults`: file-backed page faults by file. The kernel counts by
//! (process, device, inode); the first fault of a process on a file is sent
//! up so the file is named from that process's maps while it is alive, else
//! from the maps kept of it (a forked child has its parent's), else from
//! the followed processes' maps at the next report.

use std::collections::HashMap;

use memtrace_common::{
    ffaults::FileSeen,
    kind,
    names::{FILES_SEEN, FILE_FAULTS, FOLLOWED},
};

use crate::error::Result;
use crate::output::{clock, Col, Printer, Row};
use crate::process::maps::read_maps;
use crate::process::proc::split_dev;
use crate::run::args::IntervalArgs;
use crate::run::tool::{About, Prep, Tool};
use crate::session::attach::Probe;
use crate::session::records::{comm, record};
use crate::stacks::Traced;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::run::args::Common,
    #[command(flatten)]
    pub interval: IntervalArgs,
    /// Show only the N files with the most faults (text: 20 unless given;
    /// JSON carries every file unless given). What the others add up to is
    /// said.
    #[arg(long)]
    pub top: Option<usize>,
    /// One row per (process, file) instead of per file.
    #[arg(short = 'P', long)]
    pub per_process: bool,
}

pub fn probes() -> Vec<Probe> {
    vec![crate::probes::counters::ffault_probe()]
}

pub struct Ffaults {
    args: Args,
    names: HashMap<(u32, u64), String>,
    /// Files not named yet: looked for again before each report.
    unnamed: std::collections::HashSet<(u32, u64)>,
    /// `-p`/`-c`'s process.
    target: Option<u32>,
    comms: HashMap<u32, String>,
    faults: u64,
    /// `faults` and what a SIGUSR1 report (not clearing) showed since.
    seen: u64,
}

impl Ffaults {
    pub fn new(a: &Args) -> Result<Self> {
        Ok(Ffaults {
            args: a.clone(),
            names: HashMap::new(),
            unnamed: Default::default(),
            target: None,
            comms: HashMap::new(),
            faults: 0,
            seen: 0,
        })
    }

    fn name(&self, dev: u32, ino: u64) -> String {
        self.names.get(&(dev, ino)).cloned().unwrap_or_else(|| {
            let (ma, mi) = split_dev(dev);
            format!("[dev {ma}:{mi} inode {ino}]")
        })
    }

    /// The path of file `key` as `pid` maps it now (an exiting process
    /// shows no maps), else as memtrace kept its maps or any other's.
    fn look_up(s: &Traced, pid: u32, key: (u32, u64)) -> Option<String> {
        let dev = split_dev(key.0);
        // Kept already (no read): the file a forked child faults is mostly
        // one its parent mapped.
        if let Some(p) = s.sym.maps.lock().unwrap().path_of(pid, dev, key.1) {
            return Some(p.to_string());
        }
        read_maps(pid)
            .unwrap_or_default()
            .into_iter()
            .find(|m| m.dev == dev && m.inode == key.1)
            .map(|m| m.path.to_string())
    }

    /// Files still unnamed, looked for once in the processes followed
    /// now: one that none maps stays a number, and is not looked for at
    /// every report in every process's maps.
    fn name_the_rest(&mut self, s: &mut Traced) {
        if self.unnamed.is_empty() {
            return;
        }
        let mut unnamed = std::mem::take(&mut self.unnamed);
        let mut pids: Vec<u32> = s
            .hash_entries(FOLLOWED)
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        pids.extend(self.target);
        for pid in pids {
            let Some(maps) = read_maps(pid) else { continue };
            unnamed.retain(|key| {
                let dev = split_dev(key.0);
                match maps.iter().find(|m| m.dev == dev && m.inode == key.1) {
                    Some(m) => {
                        self.names.insert(*key, m.path.to_string());
                        false
                    }
                    None => true,
                }
            });
            if unnamed.is_empty() {
                return;
            }
        }
    }

    fn report_files(&mut self, s: &mut Traced, out: &mut dyn Printer, clear: bool) -> Result<()> {
        self.name_the_rest(s);
        let raw = s.read_counts(FILE_FAULTS, clear)?;
        let n: u64 = raw.iter().map(|(_, c)| c).sum();
        // A report that does not clear (SIGUSR1) shows counts that the next
        // one shows again: they are the summary's only until then.
        if clear {
            self.faults += n;
            self.seen = self.faults;
        } else {
            self.seen = self.faults + n;
        }
        let per = self.args.per_process;
        let mut agg: HashMap<(u32, u32, u64), u64> = HashMap::new();
        for (k, c) in raw {
            *agg.entry((if per { k.tgid } else { 0 }, k.dev, k.ino))
                .or_default() += c;
        }
        let mut v: Vec<_> = agg.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let shown = crate::run::tool::shown(self.args.top, &self.args.common, false);
        let what = if per { "processes' files" } else { "files" };
        let rest = crate::output::cut(&mut v, shown, what, |e| e.1);
        let title = if self.args.interval.every().is_some() {
            format!("{} file faults", clock())
        } else {
            String::new()
        };
        let mut cols = vec![Col::num("faults", "FAULTS", 10)];
        if per {
            cols.push(Col::num("pid", "PID", 7));
            cols.push(Col::text("comm", "COMM", 16));
        }
        cols.push(Col::text("file", "FILE", 10));
        let rows: Vec<Row> = v
            .into_iter()
            .map(|((pid, dev, ino), c)| {
                let mut r = vec![c.into()];
                if per {
                    r.push(pid.into());
                    r.push(self.comms.get(&pid).cloned().unwrap_or_default().into());
                }
                r.push(self.name(dev, ino).into());
                Row(r)
            })
            .collect();
        out.table("file_faults", &title, &cols, &rows);
        if let Some(r) = rest {
            out.rest("file_faults", &r);
        }
        Ok(())
    }
}

pub const ABOUT: About = About {
    name: "ffaults",
    help: "File-backed page faults by file",
    traces: "file-backed page faults",
    interval: None,
};

impl Tool for Ffaults {
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
        self.target = k.target;
        crate::probes::counters::prepare_ffaults(k, 16384)?;
        k.loader.max_entries(FILES_SEEN, 16384);
        Ok(())
    }

    fn on_record(&mut self, data: &[u8], s: &mut Traced, _out: &mut dyn Printer) -> Result<()> {
        let Some(ev) = record::<FileSeen>(data, kind::FILE_SEEN) else {
            return Ok(());
        };
        self.comms
            .entry(ev.key.tgid)
            .or_insert_with(|| comm(&ev.comm));
        let key = (ev.key.dev, ev.key.ino);
        if self.names.contains_key(&key) {
            return Ok(());
        }
        match Self::look_up(s, ev.key.tgid, key) {
            Some(path) => {
                self.unnamed.remove(&key);
                self.names.insert(key, path);
            }
            None => {
                self.unnamed.insert(key);
            }
        }
        Ok(())
    }

    fn report(&mut self, s: &mut Traced, out: &mut dyn Printer, clear: bool) -> Result<()> {
        self.report_files(s, out, clear)
    }

    fn events(&self) -> u64 {
        self.seen
    }
}
