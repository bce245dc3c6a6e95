//! The event loop of a run: records, interval reports, signals, the
//! target's exit and the tool's own descriptor, until one ends it.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use memtrace_common::kind;
use tokio::io::unix::AsyncFd;

use crate::error::Result;
use crate::output::{self, Printer};
use crate::run::args::Common;
use crate::run::tool::Tool;
use crate::stacks::Traced;

struct Fd(OwnedFd);
impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// A descriptor the tool owns, watched for it.
struct Borrowed(RawFd);
impl AsRawFd for Borrowed {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// How often counting tools without interval reports empty the kernel's
/// maps into their own totals (`Tool::drain`), and walked user stacks are
/// taken out of theirs, when little arrives.
const RECLAIM_EVERY: Duration = Duration::from_millis(250);

/// A drain or harvest that moved keys at this rate (per second since the
/// last) is followed by another at the next ring-buffer tick: processes
/// starting by the hundred a second (a build) fill a map of 16384 keys well
/// within a second, the sooner on a busy machine where memtrace itself gets
/// little CPU. A rate, not a count: stacks unwound in the kernel are keys of
/// their own per process, and 1200 processes in 2 s filled 1024 keys
/// between rounds that each moved fewer than 1024.
const RECLAIM_SOON_RATE: f64 = 512.0;

/// How often the allocator gives back the pages its freed memory left
/// (malloc_trim): rounds free what exited processes held, and glibc
/// returns only the top of each heap on its own.
const TRIM_EVERY: Duration = Duration::from_secs(2);

/// Keeps the kernel's count and stack maps from filling in long runs.
struct Reclaim {
    last: Instant,
    soon: bool,
    trimmed: Instant,
}

impl Reclaim {
    fn new() -> Reclaim {
        // Soon until a round finds the maps quiet.
        Reclaim {
            last: Instant::now(),
            soon: true,
            trimmed: Instant::now(),
        }
    }

    /// At every housekeeping tick (every `RECLAIM_EVERY`), unless a round
    /// ran since the last tick. Compared with the whole period, the round's
    /// own time put `last` past the tick, and every other tick was skipped:
    /// rounds came every 500 ms, and twice the keys waited in the maps.
    fn due(&self) -> bool {
        self.soon || self.last.elapsed() >= RECLAIM_EVERY / 2
    }

    fn run(&mut self, tool: &mut dyn Tool, session: &mut Traced) -> Result<()> {
        let mut moved = session.harvest_user_stacks()?;
        moved = moved.max(crate::probes::follow::forget_exited(session)?);
        moved = moved.max(tool.forget_exited(session)?);
        crate::stacks::ustack::resolve_exited_samples(session);
        // Interval reports empty the count maps themselves.
        if tool.interval().is_none() {
            moved = moved.max(tool.drain(session)?);
        }
        let secs = self.last.elapsed().as_secs_f64().max(1e-3);
        self.soon = moved as f64 / secs >= RECLAIM_SOON_RATE;
        self.last = Instant::now();
        if self.trimmed.elapsed() >= TRIM_EVERY {
            // SAFETY: glibc's malloc_trim takes no pointer; 0 keeps no pad.
            #[cfg(target_env = "gnu")]
            unsafe {
                libc::malloc_trim(0);
            }
            self.trimmed = Instant::now();
        }
        Ok(())
    }
}

/// How often the ring buffer is drained without a wakeup: batched records
/// wait no longer than this.
const DRAIN_EVERY: Duration = Duration::from_millis(20);

pub(crate) struct Signals {
    pub int: tokio::signal::unix::Signal,
    pub term: tokio::signal::unix::Signal,
    pub hup: tokio::signal::unix::Signal,
    pub usr1: tokio::signal::unix::Signal,
}

impl Signals {
    /// Whether a stop signal (INT, TERM, HUP) has come, without waiting. A
    /// set-up step that fails after one was cut short by it (the verifier
    /// gives up on a pending signal, and aya's load then fails on
    /// something else), not broken: the run ends as the signal asked.
    pub fn stop_pending(&mut self) -> bool {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        [&mut self.int, &mut self.term, &mut self.hup]
            .into_iter()
            .any(|s| s.poll_recv(&mut cx).is_ready())
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) async fn event_loop(
    tool: &mut dyn Tool,
    session: &mut Traced,
    out: &mut dyn Printer,
    common: &Common,
    mut sig: Signals,
    pidfd: Option<OwnedFd>,
    mut exited: Option<&mut tokio::sync::oneshot::Receiver<i32>>,
) -> Result<(Option<i32>, bool, Vec<(&'static str, u64)>)> {
    let rb = session.ring_buffer()?;
    // SAFETY: the ring buffer owns its map fd for as long as the AsyncFd lives.
    let mut rb = unsafe { AsyncFd::register(rb) }.map_err(std::io::Error::from)?;
    let far = Duration::from_secs(86400 * 365);
    let deadline = tokio::time::Instant::now() + common.duration.unwrap_or(far);
    let mut interval = tokio::time::interval(tool.interval().unwrap_or(far));
    interval.tick().await;
    let limit = tool.intervals().and_then(|i| i.limit());
    let mut intervals = 0u64;
    let mut housekeeping = tokio::time::interval(RECLAIM_EVERY);
    let mut drain = tokio::time::interval(DRAIN_EVERY);
    let pidfd = match pidfd {
        // SAFETY: `Fd` owns the pidfd for as long as the AsyncFd lives.
        Some(fd) => Some(unsafe { AsyncFd::register(Fd(fd)) }.map_err(std::io::Error::from)?),
        None => None,
    };
    let wakeup = match tool.wakeup_fd() {
        // SAFETY: the tool keeps its fd open for as long as the run lasts.
        Some(fd) => Some(unsafe { AsyncFd::register(Borrowed(fd)) }.map_err(std::io::Error::from)?),
        None => None,
    };
    let mut warned_loss = Vec::new();
    let mut status = None;
    let mut last_maps = Instant::now();
    let mut reclaim = Reclaim::new();
    let started = Instant::now();
    let mut last_progress = started;
    let mut counted_out = false;
    loop {
        // A stop comes first. On a churning host some branch is always
        // ready and each round takes a while, so the loop never yielded:
        // the runtime's driver, which sees signals, ran only once the task
        // had spent its cooperative budget (19.5 s and 34 s from Ctrl-C to
        // exit). Yielding lets it run, and select! picks among ready
        // branches at random: the stop is checked before.
        tokio::task::yield_now().await;
        if sig.stop_pending() || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::select! {
            guard = rb.readable_mut() => {
                let mut guard = guard?;
                let ring = guard.get_inner_mut();
                while let Some(item) = ring.next() {
                    dispatch(&item, tool, session, out)?;
                }
                out.flush();
                guard.clear_ready();
                // A closed pipe or a full disk ends the run: memtrace
                // detaches rather than tracing for nobody.
                output::check(out)?;
            }
            _ = drain.tick() => {
                {
                    let mut maps = session.sym.maps.lock().unwrap();
                    maps.refresh_due();
                    maps.refresh_missed();
                }
                drain_ring(&mut rb, tool, session, out)?;
                out.flush();
                output::check(out)?;
                if reclaim.soon {
                    reclaim.run(tool, session)?;
                } else {
                    // Walked stacks are taken every tick: a round that also
                    // empties count maps comes too seldom for a busy host,
                    // whose new stacks fill the kernel's store in between.
                    session.harvest_user_stacks()?;
                }
            }
            _ = sig.int.recv() => break,
            _ = sig.term.recv() => break,
            _ = sig.hup.recv() => break,
            _ = sig.usr1.recv() => {
                // Records already sent belong to the report (which
                // processes took a stack keyed by image).
                drain_ring(&mut rb, tool, session, out)?;
                tool.on_mark(session, out)?;
                out.flush();
                output::check(out)?;
            }
            _ = tokio::time::sleep_until(deadline) => break,
            _ = interval.tick() => {
                drain_ring(&mut rb, tool, session, out)?;
                tool.on_interval(session, out)?;
                out.flush();
                output::check(out)?;
                intervals += 1;
                if limit.is_some_and(|n| intervals >= n) {
                    counted_out = true;
                    break;
                }
            }
            _ = housekeeping.tick() => {
                let lost = session.losses();
                let lost_total: u64 = lost.iter().map(|(_, n)| n).sum();
                if let Some(w) = crate::run::losses::warning(&lost, &warned_loss) {
                    say!("{w}");
                    warned_loss = lost;
                }
                if reclaim.due() {
                    // The records already sent belong to what the round
                    // moves: a process resolved once its owner is gone
                    // would otherwise miss the children whose records
                    // were still in the buffer.
                    drain_ring(&mut rb, tool, session, out)?;
                    reclaim.run(tool, session)?;
                }
                if let Some(every) = common.progress {
                    if last_progress.elapsed() >= every {
                        say!(
                            "memtrace: progress: {:.0}s, {} events, {lost_total} lost",
                            started.elapsed().as_secs_f64(),
                            tool.events()
                        );
                        // On the period's beat, not from this late tick:
                        // a minute sampler saw every few lines twice.
                        while last_progress.elapsed() >= every {
                            last_progress += every;
                        }
                    }
                }
                if let (Some(p), true) = (common.pid, last_maps.elapsed() > Duration::from_secs(1)) {
                    session.sym.maps.lock().unwrap().snapshot(p);
                    last_maps = Instant::now();
                }
            }
            r = async { pidfd.as_ref().unwrap().readable().await }, if pidfd.is_some() => {
                let _ = r;
                break;
            }
            st = async { exited.as_mut().unwrap().await }, if exited.is_some() => {
                status = Some(st.unwrap_or(-1));
                break;
            }
            guard = async { wakeup.as_ref().unwrap().readable().await }, if wakeup.is_some() => {
                let mut guard = guard?;
                tool.on_wakeup(session, out)?;
                guard.clear_ready();
                out.flush();
                output::check(out)?;
            }
        }
        if tool.done() {
            break;
        }
    }
    // Whatever is still in the buffer belongs to the report.
    drain_ring(&mut rb, tool, session, out)?;
    Ok((status, counted_out, warned_loss))
}

/// Every record waiting in the ring buffer, dispatched.
fn drain_ring(
    rb: &mut AsyncFd<aya::maps::RingBuf<aya::maps::MapData>>,
    tool: &mut dyn Tool,
    session: &mut Traced,
    out: &mut dyn Printer,
) -> Result<()> {
    let ring = rb.get_mut();
    while let Some(item) = ring.next() {
        dispatch(&item, tool, session, out)?;
    }
    Ok(())
}

/// Copied stacks go to the unwinder, every other record to the tool.
fn dispatch(
    item: &[u8],
    tool: &mut dyn Tool,
    session: &mut Traced,
    out: &mut dyn Printer,
) -> Result<()> {
    if crate::probes::follow::on_record(item, session)
        || crate::probes::exemaps::on_record(item, session)
    {
        return Ok(());
    }
    if item.get(..4) == Some(&kind::UNWIND_MISS.to_ne_bytes()) {
        session.sym.maps.lock().unwrap().refresh_missed();
        return Ok(());
    }
    if let Some(m) = crate::session::records::record(item, kind::STACK_MEMBER) {
        session.members.note(&m);
        return Ok(());
    }
    if item.get(..4) == Some(&kind::STACK_SAMPLE.to_ne_bytes()) {
        if let Some(d) = session.dwarf.as_mut() {
            d.add(&mut session.sym.maps.lock().unwrap(), item);
        }
        return Ok(());
    }
    tool.on_record(item, session, out)
}
