//! The per-process counting programs several views share: page faults
//! (faults, top, serve), brk calls (brkstack, top, serve) and file faults
//! (ffaults, top, serve): their probes with fallbacks, and their globals.

use memtrace_common::{
    brk::BrkConfig,
    faults::FaultConfig,
    ffaults::FfaultsConfig,
    names::{
        BRK_CFG, BRK_ENTER, FAULTS, FAULTS_KERNEL_BTF, FAULTS_KERNEL_TP, FAULTS_PERF,
        FAULTS_PERF_PROG, FAULTS_RAW, FAULTS_USER_BTF, FAULTS_USER_TP, FAULT_CFG, FFAULTS_FENTRY,
        FFAULTS_KPROBE, FFAULTS_TP, FFAULT_CFG, FILE_FAULTS,
    },
};

use crate::error::Result;
use crate::session::attach::{Method, Probe};
use crate::session::Prep;

/// User and kernel page faults, best way first.
pub fn fault_probes() -> Vec<Probe> {
    vec![
        Probe::new("user page faults")
            // raw_tp first: as cheap per fault as tp_btf, it attaches
            // without parsing kernel BTF (tens of ms at start-up), and one
            // program serves both modes, so it is verified once.
            .raw_tp(FAULTS_RAW, "exceptions", "page_fault_user")
            .tp_btf(FAULTS_USER_BTF, "exceptions", "page_fault_user")
            .tracepoint(FAULTS_USER_TP, "exceptions", "page_fault_user")
            .perf_page_faults(FAULTS_PERF_PROG),
        // The perf event above sees both modes; where it is used this one adds nothing.
        Probe::new("kernel page faults")
            .raw_tp(FAULTS_RAW, "exceptions", "page_fault_kernel")
            .tp_btf(FAULTS_KERNEL_BTF, "exceptions", "page_fault_kernel")
            .tracepoint(FAULTS_KERNEL_TP, "exceptions", "page_fault_kernel")
            .optional(),
    ]
}

/// Sets FAULT_CFG (`slot_mask` and `by_page` as given) and sizes the count
/// map the attach will use to `keys`.
pub fn prepare_faults(k: &mut Prep, mut cfg: FaultConfig, keys: u32) -> Result<()> {
    let tp = k.format("exceptions", "page_fault_user");
    let exceptions = tp.is_ok();
    if let Ok(f) = tp {
        cfg.tp_address = f.offset("address")?;
        cfg.tp_error_code = f.offset("error_code")?;
    }
    k.loader.global(FAULT_CFG, &cfg);
    k.loader.max_entries(FAULTS, keys);
    // The perf path preallocates; pay for it only where it will be taken.
    if !exceptions || k.forced == Some(Method::Perf) {
        k.loader.max_entries(FAULTS_PERF, keys);
    }
    Ok(())
}

pub fn brk_probe() -> Probe {
    Probe::new("brk calls").tracepoint(BRK_ENTER, "syscalls", "sys_enter_brk")
}

/// Sets BRK_CFG (and the task offsets the program reads `mm->brk` with).
pub fn prepare_brk(k: &mut Prep) -> Result<()> {
    k.task_offsets()?;
    let f = k.format("syscalls", "sys_enter_brk")?;
    k.loader.global(
        BRK_CFG,
        &BrkConfig {
            tp_brk: f.offset("brk")?,
            _pad: 0,
        },
    );
    Ok(())
}

pub fn ffault_probe() -> Probe {
    Probe::new("file page faults")
        .tracepoint(FFAULTS_TP, "filemap", "mm_filemap_fault")
        .kprobe(FFAULTS_KPROBE, "filemap_fault")
        .fentry(FFAULTS_FENTRY, "filemap_fault")
}

/// Sets FFAULT_CFG and sizes FILE_FAULTS. Each way needs its own offsets:
/// where they are missing, that way is ruled out with the reason, never run
/// reading at offset 0.
pub fn prepare_ffaults(k: &mut Prep, keys: u32) -> Result<()> {
    let mut cfg = FfaultsConfig::default();
    match k
        .format("filemap", "mm_filemap_fault")
        .and_then(|f| Ok((f.offset("i_ino")?, f.offset("s_dev")?)))
    {
        Ok((ino, dev)) => (cfg.tp_ino, cfg.tp_dev) = (ino, dev),
        Err(e) => {
            k.loader.rule_out(FFAULTS_TP, e.to_string());
        }
    }
    let fallback = k.btf().and_then(|b| {
        let mut r = b.resolver();
        let c = FfaultsConfig {
            vmf_vma: r.member("vm_fault", "vma"),
            vma_file: r.member("vm_area_struct", "vm_file"),
            file_inode: r.member("file", "f_inode"),
            inode_ino: r.member("inode", "i_ino"),
            inode_sb: r.member("inode", "i_sb"),
            sb_dev: r.member("super_block", "s_dev"),
            ..cfg
        };
        r.done("filemap_fault's offsets", c)
    });
    match fallback {
        Ok(c) => cfg = c,
        Err(e) => {
            k.loader.rule_out(FFAULTS_KPROBE, e.to_string());
            k.loader.rule_out(FFAULTS_FENTRY, e.to_string());
        }
    }
    k.loader.global(FFAULT_CFG, &cfg);
    k.loader.max_entries(FILE_FAULTS, keys);
    Ok(())
}
