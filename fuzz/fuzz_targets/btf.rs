//! Kernel BTF (`/sys/kernel/btf/vmlinux`): every lookup memtrace makes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use memtrace::kernel::KernelBtf;

fuzz_target!(|data: &[u8]| {
    let Ok(btf) = KernelBtf::from_vec(data.to_vec()) else {
        return;
    };
    let _ = btf.task_offsets();
    let _ = btf.offset("pt_regs", "sp");
    let _ = btf.size("task_struct");
    let _ = btf.enumerator("cgroup_subsys_id", "memory_cgrp_id");
    let _ = btf.enumerator("", "MM_ANONPAGES");
    let _ = btf.has_func("swap_read_folio");
    let _ = btf.has_btf_tracepoint("mark_victim");
});
