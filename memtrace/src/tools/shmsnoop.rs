//! `memtrace shmsnoop`: one line per SysV shm call (shmget, shmat, shmdt,
//! shmctl) with decoded arguments and the result or errno, like BCC's
//! shmsnoop but from the syscall tracepoints (it needs kprobes).

use memtrace_common::{
    kind,
    snoop::{self, op, ShmSnoopConfig, SyscallEvent},
};

use memtrace_common::names;

use crate::error::Result;
use crate::output::{clock, Col, Printer, Row, Value};
use crate::probes::syscalls::decode::{errno_name, shm_key, shmat_flags, shmctl_cmd, shmget_flags};
use crate::probes::syscalls::{arg_offsets, ret_offset, self_tgid};
use crate::run::tool::{About, Prep, Tool};
use crate::session::attach::Probe;
use crate::session::records::{comm, record};
use crate::stacks::Traced;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::run::args::Common,
    /// Show only failed calls (filtered in the kernel).
    #[arg(short = 'x', long = "failed")]
    pub failed: bool,
}

pub fn probes() -> Vec<Probe> {
    vec![
        Probe::new("shmget entry").tracepoint(names::SHMGET_ENTER, "syscalls", "sys_enter_shmget"),
        Probe::new("shmget return").tracepoint(names::SHMGET_EXIT, "syscalls", "sys_exit_shmget"),
        Probe::new("shmat entry").tracepoint(names::SHMAT_ENTER, "syscalls", "sys_enter_shmat"),
        Probe::new("shmat return").tracepoint(names::SHMAT_EXIT, "syscalls", "sys_exit_shmat"),
        Probe::new("shmdt entry").tracepoint(names::SHMDT_ENTER, "syscalls", "sys_enter_shmdt"),
        Probe::new("shmdt return").tracepoint(names::SHMDT_EXIT, "syscalls", "sys_exit_shmdt"),
        Probe::new("shmctl entry").tracepoint(names::SHMCTL_ENTER, "syscalls", "sys_enter_shmctl"),
        Probe::new("shmctl return").tracepoint(names::SHMCTL_EXIT, "syscalls", "sys_exit_shmctl"),
    ]
}

// RESULT before ARGS, as BCC's shmsnoop: ARGS has no useful width.
const COLS: [Col; 6] = [
    Col::text("time", "TIME", 8),
    Col::num("pid", "PID", 7),
    Col::text("comm", "COMM", 16),
    Col::text("syscall", "SYSCALL", 7),
    Col::text("result", "RESULT", 14),
    Col::text("args", "ARGS", 4),
];

/// The call's name, decoded arguments and result.
fn describe(ev: &SyscallEvent) -> (&'static str, String, String) {
    let a = ev.args;
    let (name, args) = match ev.op {
        op::SHMGET => (
            "shmget",
            format!(
                "key={} size={} shmflg={}",
                shm_key(a[0]),
                a[1],
                shmget_flags(a[2])
            ),
        ),
        op::SHMAT => (
            "shmat",
            format!(
                "shmid={} shmaddr={:#x} shmflg={}",
                a[0] as i32,
                a[1],
                shmat_flags(a[2])
            ),
        ),
        op::SHMDT => ("shmdt", format!("shmaddr={:#x}", a[0])),
        _ => (
            "shmctl",
            format!(
                "shmid={} cmd={} buf={:#x}",
                a[0] as i32,
                shmctl_cmd(a[1]),
                a[2]
            ),
        ),
    };
    let result = if snoop::failed(ev.op, a[0], ev.ret) {
        errno_name(ev.ret)
    } else if ev.op == op::SHMAT {
        format!("{:#x}", ev.ret as u64)
    } else {
        ev.ret.to_string()
    };
    (name, args, result)
}

pub struct Shmsnoop {
    args: Args,
    calls: u64,
    failed: u64,
}

impl Shmsnoop {
    pub fn new(a: &Args) -> Result<Self> {
        Ok(Shmsnoop {
            args: a.clone(),
            calls: 0,
            failed: 0,
        })
    }
}

pub const ABOUT: About = About {
    name: "shmsnoop",
    help: "One line per SysV shm call (shmget, shmat, shmdt, shmctl)",
    traces: "SysV shared memory calls",
    interval: None,
};

impl Tool for Shmsnoop {
    fn about(&self) -> &'static About {
        &ABOUT
    }
    fn what(&self) -> String {
        let which = if self.args.failed { "failed " } else { "" };
        format!("{which}SysV shared memory calls")
    }
    fn probes(&self) -> Vec<Probe> {
        probes()
    }

    fn prepare(&mut self, k: &mut Prep) -> Result<()> {
        let cfg = ShmSnoopConfig {
            shmget: arg_offsets(k, "sys_enter_shmget", ["key", "size", "shmflg"])?,
            shmat: arg_offsets(k, "sys_enter_shmat", ["shmid", "shmaddr", "shmflg"])?,
            shmdt: arg_offsets(k, "sys_enter_shmdt", ["shmaddr"])?[0],
            shmctl: arg_offsets(k, "sys_enter_shmctl", ["shmid", "cmd", "buf"])?,
            shmget_ret: ret_offset(k, "sys_exit_shmget")?,
            shmat_ret: ret_offset(k, "sys_exit_shmat")?,
            shmdt_ret: ret_offset(k, "sys_exit_shmdt")?,
            shmctl_ret: ret_offset(k, "sys_exit_shmctl")?,
            failed_only: self.args.failed as u32,
            self_tgid: self_tgid(),
        };
        k.loader.global(names::SHM_SNOOP, &cfg);
        k.loader.max_entries(names::SNOOP_PENDING, 4096);
        Ok(())
    }

    fn on_record(&mut self, data: &[u8], _s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        let Some(ev) = record::<SyscallEvent>(data, kind::SHM_CALL) else {
            return Ok(());
        };
        self.calls += 1;
        if snoop::failed(ev.op, ev.args[0], ev.ret) {
            self.failed += 1;
        }
        let (name, args, result) = describe(&ev);
        let row = Row(vec![
            clock().into(),
            ev.pid.into(),
            comm(&ev.comm).into(),
            name.into(),
            result.into(),
            args.into(),
        ]);
        out.event("shm_call", &COLS, &row);
        Ok(())
    }

    fn events(&self) -> u64 {
        self.calls
    }

    fn summary_extra(&self) -> Vec<(&'static str, Value)> {
        vec![("failed", self.failed.into())]
    }
}
