//! Feature probes made before paying for an attach path.

use std::io;

/// `BPF_PROG_LOAD`'s attribute prefix, up to `attach_prog_fd`
/// (include/uapi/linux/bpf.h); the kernel zero-extends the rest.
#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    attach_btf_id: u32,
    attach_prog_fd: u32,
}

const BPF_PROG_LOAD: libc::c_long = 5;
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
    // SAFETY: attr and what it points to outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            &attr as *const ProgLoad,
            std::mem::size_of::<ProgLoad>() as u32,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this descriptor.
    unsafe { libc::close(fd as libc::c_int) };
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn attr_layout_matches_the_uapi() {
        // attach_btf_id sits at byte 108 of union bpf_attr for BPF_PROG_LOAD.
        assert_eq!(std::mem::offset_of!(super::ProgLoad, attach_btf_id), 108);
        assert_eq!(
            std::mem::offset_of!(super::ProgLoad, expected_attach_type),
            68
        );
    }
}
