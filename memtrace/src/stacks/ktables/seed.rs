//! Tables for the processes already running when a system-wide run starts,
//! built in the background: the probes are attached at once, and an old
//! process's events find its tables seconds later at most (until then its
//! stacks are walked by frame pointers, counted as `tables_pending`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::build;
use crate::stacks::symbolize::SharedMaps;

/// How long before the seeding says how far it has got.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// What the seeding did, for the summary.
#[derive(Debug, Default, Clone, Copy)]
pub struct Seeded {
    /// Processes running at the start.
    pub running: u64,
    /// Of them, those whose maps were read (the rest: kernel threads, or
    /// gone meanwhile).
    pub read: u64,
    /// Until every running process had its tables.
    pub ms: f64,
    /// The run ended first.
    pub cut_short: bool,
}

pub struct Seeder {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Seeded>>,
}

impl Seeder {
    /// Starts reading every running process's maps (and so building the
    /// tables of the files they map) on a thread of its own.
    pub fn start(maps: SharedMaps) -> Seeder {
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let handle = std::thread::Builder::new()
            .name("unwind-tables".into())
            .spawn(move || seed(&maps, &halt))
            .ok();
        Seeder { stop, handle }
    }

    /// Ends the seeding (if still going) and says what it did.
    pub fn finish(mut self) -> Seeded {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

fn seed(maps: &SharedMaps, stop: &AtomicBool) -> Seeded {
    let t0 = Instant::now();
    let me = std::process::id();
    let pids: Vec<u32> = crate::process::proc::pids()
        .into_iter()
        .filter(|&p| p != me)
        .collect();
    let mut done = Seeded {
        running: pids.len() as u64,
        ..Default::default()
    };
    let mut told = t0;
    for (i, &pid) in pids.iter().enumerate() {
        if stop.load(Ordering::Relaxed) {
            done.cut_short = true;
            break;
        }
        build_files(maps, pid);
        // One process at a time: the event loop takes the lock between.
        if maps.lock().map(|mut m| m.snapshot(pid)).unwrap_or(false) {
            done.read += 1;
        }
        if told.elapsed() >= PROGRESS_EVERY {
            told = Instant::now();
            say!(
                "memtrace: unwind tables: {} of {} running processes read...",
                i + 1,
                pids.len()
            );
        }
    }
    done.ms = t0.elapsed().as_secs_f64() * 1e3;
    if !done.cut_short {
        // From here on, an old process's stacks are unwound whole.
        say!(
            "memtrace: unwind tables: the {} running processes read in {:.0} ms",
            done.read,
            done.ms
        );
    }
    done
}

/// Builds the rows of `pid`'s executable files not placed yet without the
/// lock (a large binary's take a few hundred ms, which would hold up the
/// event loop and the tables of processes that start meanwhile), then
/// places each under it.
fn build_files(maps: &SharedMaps, pid: u32) {
    let Some(mappings) = crate::process::maps::read_maps(pid) else {
        return;
    };
    for m in mappings
        .iter()
        .filter(|m| m.perms.contains('x') && m.inode != 0 && m.path.starts_with('/'))
    {
        let id = (m.dev, m.inode);
        let known = |maps: &SharedMaps| {
            maps.lock()
                .map(|g| g.ktables.as_ref().is_none_or(|k| k.knows(id)))
                .unwrap_or(true)
        };
        if known(maps) {
            continue;
        }
        let Ok(f) = m.open_in(pid) else {
            continue;
        };
        let t0 = Instant::now();
        let built = build::file_rows(&f);
        if let Ok(mut g) = maps.lock() {
            if let Some(k) = g.ktables.as_mut() {
                k.place_built(id, &m.path, built, t0);
            }
        }
    }
}
