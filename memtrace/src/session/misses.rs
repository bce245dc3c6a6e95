//! Program runs the kernel skipped. A tracing program does not run when
//! another BPF program is already running on its CPU (an interrupt that
//! arrives while one runs, or another tool's program), and the kernel
//! counts each such run in the program's `recursion_misses` (Linux 5.12):
//! events memtrace never saw, which must be shown like any other loss. aya
//! 0.14's `ProgramInfo` does not expose the counter, so it is read here with
//! BPF_OBJ_GET_INFO_BY_FD.

use std::os::fd::{AsFd, BorrowedFd};

use aya_obj::generated::bpf_prog_info;
use memtrace_common::names;

use super::Session;

/// The program's skipped runs; None where the kernel does not say.
fn recursion_misses(fd: BorrowedFd<'_>) -> Option<u64> {
    // SAFETY: bpf_prog_info is the uapi's plain-data struct.
    let info: bpf_prog_info = unsafe { crate::kernel::bpfsys::obj_info(fd) }.ok()?;
    Some(info.recursion_misses)
}

/// Programs that run on kernel-mode page faults. One is re-entered only by
/// a fault taken while it runs on that CPU: its own stack walk reading user
/// memory that is not resident (or an interrupt inside it). Those faults
/// map nothing and are memtrace's, not the traced program's: skipped, not
/// lost. The raw_tp program also runs on user-mode faults, which cannot
/// come while it runs: its skipped runs are all of that kind too.
const ON_KERNEL_FAULTS: [&str; 3] = [
    names::FAULTS_RAW.0,
    names::FAULTS_KERNEL_BTF.0,
    names::FAULTS_KERNEL_TP.0,
];

impl Session {
    fn misses(&self, own: bool) -> u64 {
        self.bpf
            .programs()
            .filter(|(name, _)| self.loaded.contains(name))
            .filter(|(name, _)| ON_KERNEL_FAULTS.contains(name) == own)
            .filter_map(|(_, p)| recursion_misses(p.fd().ok()?.as_fd()))
            // Programs loaded by hand (uprobe sessions) are none of those.
            .chain(
                self.raw_progs
                    .iter()
                    .filter(|_| !own)
                    .filter_map(|p| recursion_misses(p.as_fd())),
            )
            .sum()
    }

    /// Runs the kernel skipped, over every program this session loaded.
    pub fn missed_runs(&self) -> u64 {
        self.misses(false)
    }

    /// Kernel-mode faults taken inside memtrace's own fault programs.
    pub fn own_faults(&self) -> u64 {
        self.misses(true)
    }
}
