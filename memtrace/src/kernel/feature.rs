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
    call_fd(BPF_PROG_LOAD, &attr)?;
    Ok(())
}
