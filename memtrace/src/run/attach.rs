//! Loading a tool's programs and attaching its probes, the same for a run
//! and for `doctor`: the filter and stack globals, map sizes, and the retry
//! without in-kernel unwinding where this kernel refuses it.

use memtrace_common::{names, stack_mode, Filter};

use crate::error::Result;
use crate::kernel::Format;
use crate::output::frame::FrameStyle;
use crate::run::args::Common;
use crate::run::tool::{Prep, Tool};
use crate::session::{Loader, Session};
use crate::stacks::Traced;

/// The EVENTS ring buffer's size in the kernel object, unless a tool sets one.
const DEFAULT_RING_BYTES: u32 = 256 * 1024;

/// Loads the tool's programs with the globals and map sizes it asks for, and
/// attaches its probes: the same for a run and for `doctor`.
pub fn attach(
    tool: &mut dyn Tool,
    common: &Common,
    target: Option<u32>,
    follow: bool,
) -> Result<Traced> {
    let system_wide = target.is_none();
    match attach_with(tool, common, target, follow, false) {
        // In-kernel unwinding refused (verifier, BTF, memory): the copy
        // path still gives complete stacks, at a copy per event.
        Err(e) if tool_unwinds_in_kernel(tool, system_wide) => {
            // The reasons give a refused program's first line (-v the end
            // of the verifier's log, where it says why); the next line
            // names the fallback.
            say!("memtrace: in-kernel unwinding could not be set up: {e}");
            attach_with(tool, common, target, follow, true)
        }
        r => r,
    }
}

/// Whether the tool's stack arguments ask for unwinding in the kernel.
fn tool_unwinds_in_kernel(tool: &dyn Tool, system_wide: bool) -> bool {
    tool.stack_mode() & stack_mode::USER != 0
        && tool
            .user_stacks()
            .is_some_and(|(a, rare)| a.in_kernel(rare, system_wide))
}

pub(crate) fn attach_with(
    tool: &mut dyn Tool,
    common: &Common,
    target: Option<u32>,
    follow: bool,
    copy_only: bool,
) -> Result<Traced> {
    let mut loader = Loader::default();
    let mut filter = Filter {
        tgid: target.unwrap_or(0),
        children: follow as u32,
        stacks: tool.stack_mode(),
        fork_child_pid: 0,
        myself: std::process::id(),
    };
    let mut dwarf =
        crate::stacks::ustack::setup(tool.user_stacks(), &mut filter, &mut loader, copy_only)?;
    if let Some(d) = dwarf.as_mut() {
        d.mode = filter.stacks;
    }
    // Forks are followed for --children, and with unwinding in the kernel
    // for the child's table (its parent's, from its first event).
    let kunwind = filter.stacks & stack_mode::KUNWIND != 0;
    if follow || kunwind {
        filter.fork_child_pid = Format::load("sched", "sched_process_fork")?.offset("child_pid")?;
    }
    if follow {
        loader.max_entries(names::FOLLOWED, 8192);
    }
    // The kernel's stack map: kernel stacks, and user stacks neither walked
    // in the program nor copied for unwinding.
    let user_by_kernel = filter.stacks & stack_mode::USER != 0
        && filter.stacks & (stack_mode::WALK | stack_mode::DWARF) == 0;
    if filter.stacks & stack_mode::KERNEL != 0 || user_by_kernel {
        loader.max_entries(names::STACKS, 16384);
    }
    loader.global(names::FILTER, &filter);
    // Stacks of processes gone before their maps could be read: their
    // executable mappings as the kernel made them.
    let learn = filter.stacks & stack_mode::USER != 0
        && crate::probes::exemaps::configure(&mut loader, common.verbose);
    tool.prepare(&mut Prep {
        loader: &mut loader,
        target,
        forced: common.attach,
        stacks: filter.stacks,
    })?;
    if let Some(bytes) = common.buffer_size {
        loader.max_entries(names::EVENTS, bytes);
    }
    // Streamed records wake memtrace once an eighth of the buffer waits
    // (and a timer drains the rest), not once per record.
    let ring = loader.size_of(names::EVENTS).unwrap_or(DEFAULT_RING_BYTES);
    loader.global(names::WAKE_BYTES, &(ring as u64 / 8));

    let mut session = Traced::new(Session::load(&loader, common.attach, common.verbose)?);
    session.dwarf = dwarf;
    session.filtered = target.is_some();
    session.walked_user_stacks = filter.stacks & stack_mode::WALK != 0;
    session
        .sym
        .set_style(match (common.addresses, common.lines) {
            (true, _) => FrameStyle::Addresses,
            (_, true) => FrameStyle::Lines,
            _ => FrameStyle::Function,
        });
    // Stacks are symbolized after their process is gone.
    session.sym.maps.lock().unwrap().keep_exited = filter.stacks & stack_mode::USER != 0;
    if follow || kunwind {
        session.attach(&crate::probes::follow::fork_probe())?;
    }
    if kunwind {
        session.attach(&crate::stacks::ktables::exit_probe())?;
    }
    if learn && crate::probes::exemaps::attach(&mut session, common.verbose)? {
        let mut maps = session.sym.maps.lock().unwrap();
        maps.learns = true;
        maps.hold_own_files();
    }
    // Execs of followed processes, for their maps, and with in-kernel
    // unwinding of any traced process, to let go of the old image's table
    // (the tool may attach the same program for names: once is enough).
    if follow || kunwind {
        let probes = tool.probes();
        let has_exec = probes
            .iter()
            .any(|p| p.ways.iter().any(|w| w.prog == names::NAME_EXEC));
        if !has_exec {
            session.attach(&crate::probes::follow::exec_probe())?;
        }
    }
    for p in tool.probes() {
        let p = if common.floor { p.floor() } else { p };
        if kunwind {
            session.attach_unless_refused(&p)?;
        } else {
            session.attach(&p)?;
        }
    }
    // Takes the unwind maps out of the object: after every program is
    // loaded (a uprobe session program is loaded at its attach, and finds
    // its maps in the object by name).
    if kunwind {
        let kt = crate::stacks::ktables::KTables::new(&mut session.bpf, common.verbose)?;
        session.sym.maps.lock().unwrap().ktables = Some(kt);
    }
    Ok(session)
}
