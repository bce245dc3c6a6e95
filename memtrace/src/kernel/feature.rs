//! Feature probes made before paying for an attach path.

use std::io;

use super::bpfsys::{call_fd, ProgLoad, BPF_PROG_LOAD};

const BPF_PROG_TYPE_TRACING: u32 = 26;
const BPF_TRACE_FENTRY: u32 = 24;

/// Whether the kernel loads an fentry program on the function with BTF id
/// `btf_id`. The probe is two instructions, so a refusal costs microseconds,
/// where aya's real load first parses all of kernel BTF (about 45 ms here).
pub fn fentry_loads(btf_id: u32) -> io::Result<()> {
    // r0 = 0; exit
    let insns: [u64; 2] = [0xb7, 0x95];
    let attr = ProgLoad {
        prog_type: BPF_PROG_TYPE_TRACING,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: c"GPL".as_ptr() as u64,
        expected_attach_type: BPF_TRACE_FENTRY,
        attach_btf_id: btf_id,
        ..Default::default()
    };
    // Dropping the descriptor unloads the probe.
    // SAFETY: insns and license are live for the call; no log is asked.
    unsafe { call_fd(BPF_PROG_LOAD, &attr) }?;
    Ok(())
}

/// Whether programs can read an attach cookie (`bpf_get_attach_cookie`,
/// Linux 5.15).
pub fn attach_cookies() -> bool {
    static HERE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HERE.get_or_init(|| helper_here("BPF_FUNC_get_attach_cookie"))
}

/// Whether programs can call `bpf_loop` (Linux 5.17): without it memtrace
/// loads its compat object.
pub fn bpf_loop() -> bool {
    static HERE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HERE.get_or_init(|| helper_here("BPF_FUNC_loop"))
}

/// Whether this kernel's BTF knows helper `id` (`enum bpf_func_id`).
/// `MEMTRACE_OBJECT=compat` says no, to try the ways of older kernels on a
/// newer one.
fn helper_here(id: &str) -> bool {
    if std::env::var("MEMTRACE_OBJECT").is_ok_and(|v| v == "compat") {
        return false;
    }
    super::KernelBtf::shared().is_ok_and(|b| b.enumerator("bpf_func_id", id).is_some())
}
