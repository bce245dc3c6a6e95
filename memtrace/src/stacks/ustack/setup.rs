//! `--stack-mode`: which way user stacks are taken (frame pointers walked
//! by the kernel, a copy unwound here with DWARF, or DWARF unwound in the
//! kernel program), and what the kernel programs need for it.

use memtrace_common::{
    kunwind::{slice, ROW_CACHE_SLOTS},
    names, stack_mode,
    stacks::{UstackConfig, STACK_SAMPLE_HDR},
    Filter,
};

use crate::error::{Error, Result};
use crate::kernel::KernelBtf;
use crate::session::Loader;
use crate::stacks::args::{StackArgs, Unwinder};
use crate::stacks::unwind::DwarfStacks;

/// `struct pt_regs` offsets of the instruction pointer, stack pointer,
/// frame pointer and link register. arm64's keeps x0..x30 in `regs`: x29
/// is the frame pointer, x30 the link register. x86-64 has no link
/// register: rbp stands in (read, never used).
fn regs_offsets(btf: &KernelBtf) -> (Option<u32>, Option<u32>, Option<u32>, Option<u32>) {
    if cfg!(target_arch = "aarch64") {
        let x = |n: u32| btf.offset("pt_regs", "regs").map(|r| r + 8 * n);
        (
            btf.offset("pt_regs", "pc"),
            btf.offset("pt_regs", "sp"),
            x(29),
            x(30),
        )
    } else {
        let bp = btf.offset("pt_regs", "bp");
        (
            btf.offset("pt_regs", "ip"),
            btf.offset("pt_regs", "sp"),
            bp,
            bp,
        )
    }
}

/// Resolves `--stack-mode`, says which was chosen, and sets what the kernel
/// programs need to take user stacks: the register and stack-top offsets,
/// and for dwarf the copy size and a ring buffer to carry the copies.
/// `copy_only` rules out unwinding in the kernel (after this kernel refused
/// it).
pub(crate) fn setup(
    user_stacks: Option<(&StackArgs, bool)>,
    filter: &mut Filter,
    loader: &mut Loader,
    copy_only: bool,
) -> Result<Option<DwarfStacks>> {
    if filter.stacks & stack_mode::USER == 0 {
        return Ok(None);
    }
    // Without bpf_loop only the kernel's walker is there (the compat
    // object's programs take no other way).
    if crate::session::compat() {
        let dwarf = user_stacks.map(|(a, _)| a.stack_mode);
        if dwarf == Some(crate::stacks::args::StackMode::Dwarf) {
            return Err(Error::Unsupported {
                what: "user stacks by DWARF".into(),
                reasons: "this kernel has no bpf_loop (Linux 5.17), which copying and unwinding \
                          stacks in memtrace's programs need; --stack-mode fp takes the kernel's walker"
                    .into(),
            });
        }
        say!(
            "memtrace: user stacks: fp by the kernel's walker (this kernel has no bpf_loop, Linux 5.17: \
             no DWARF unwinding, and a stack ends at code built without frame pointers)"
        );
        // Kept by their own hash, as walked stacks are: the stack map's
        // buckets would refuse one that hashes where another is.
        filter.stacks |= stack_mode::WALK;
        loader.max_entries(names::USTACKS, 16384);
        return Ok(None);
    }
    let system_wide = filter.tgid == 0;
    let dwarf = match user_stacks {
        Some((args, rare)) => {
            let auto = args.stack_mode == crate::stacks::args::StackMode::Auto;
            // The in-kernel unwinder refused: too many events to copy
            // each one's stack.
            let fp = copy_only && args.refused_fallback_is_fp(rare);
            if fp {
                say!(
                    "memtrace: user stacks: fp (auto, in-kernel unwinding refused: too many events to copy \
                     each stack; --stack-mode dwarf --sample N unwinds one in N through code without frame pointers)"
                );
            }
            (args.dwarf() && !fp).then_some((args, auto, args.in_kernel(rare, system_wide)))
        }
        None => None,
    };
    let btf = KernelBtf::shared()?;
    let ((ip, sp, bp, lr), top) = (regs_offsets(btf), btf.offset("mm_struct", "start_stack"));
    let (Some(ip), Some(sp), Some(bp), Some(lr), Some(top)) = (ip, sp, bp, lr, top) else {
        if dwarf.is_some() {
            return Err(Error::NoBtf(
                "no pt_regs registers or mm_struct.start_stack in kernel BTF (needed by --stack-mode dwarf)"
                    .into(),
            ));
        }
        // Elsewhere the kernel's own frame-pointer walker does.
        return Ok(None);
    };
    let mut cfg = UstackConfig {
        stack_bytes: 0,
        sample_every: 1,
        regs_ip: ip,
        regs_sp: sp,
        regs_bp: bp,
        regs_lr: lr,
        mm_start_stack: top,
        _pad: 0,
    };
    // Both ways find the main thread's stack top through task->mm.
    loader.global(names::TASK, &btf.task_offsets()?);
    let Some((args, auto, in_kernel)) = dwarf else {
        filter.stacks |= stack_mode::WALK;
        loader.global(names::USTACK, &cfg);
        loader.max_entries(names::USTACKS, 16384);
        return Ok(None);
    };
    // Sampling is a choice of the copy path: in the kernel every event is
    // unwound.
    if in_kernel && !copy_only && cfg!(target_arch = "aarch64") {
        // Refused as the kernel would refuse it: the caller says so and
        // copies instead.
        return Err(Error::Unsupported {
            what: "user stacks unwound in the kernel".into(),
            reasons: "memtrace's unwinder program walks x86-64's registers, not yet aarch64's"
                .into(),
        });
    }
    if in_kernel && !copy_only {
        filter.stacks |= stack_mode::WALK | stack_mode::KUNWIND;
        loader.global(names::USTACK, &cfg);
        loader.max_entries(names::USTACKS, 16384);
        loader.max_entries(names::UNWIND_ROWS, args.unwind_table_size);
        loader.max_entries(names::UNWIND_RULES, slice::MAX_RULES);
        loader.max_entries(names::UNWIND_PROCS, 8192);
        loader.max_entries(names::UNWIND_MISSES, 8192);
        loader.max_entries(names::UNWIND_CACHE, ROW_CACHE_SLOTS);
        loader.max_entries(names::UNWIND_FILES, 8192);
        loader.max_entries(names::UNWIND_FOUND, 8192);
        // Python processes and their threads, for their Python frames.
        loader.max_entries(names::PY_PROCS, 4096);
        loader.max_entries(names::PY_THREADS, 16384);
        // Code in no table of its process yet found by its file (5.17+).
        match btf.vma_offsets() {
            Ok(v) => {
                loader.global(names::UNWIND_VMA, &v);
            }
            Err(why) => say!(
                "memtrace: user stacks: a process's first events, before its unwind table, walk frame pointers ({why})"
            ),
        }
        say!(
            "memtrace: user stacks: dwarf{}, unwound in the kernel (every event; unwind tables up to {}, --unwind-table-size)",
            if auto { " (auto)" } else { "" },
            crate::output::human(crate::stacks::ktables::table_bytes(
                2 * args.unwind_table_size as u64
            ))
        );
        return Ok(None);
    }
    cfg.stack_bytes = args.stack_size;
    cfg.sample_every = args.sample;
    filter.stacks |= stack_mode::DWARF;
    loader.global(names::USTACK, &cfg);
    // One slot per CPU where the sample is put together.
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| Error::Io(e))? as u32;
    loader.max_entries(names::SAMPLE_SCRATCH, cpus);
    // Room for 32 full copies, and many more of the usual ones (a record is
    // as long as the stack copied): the reader drains it far more often, and
    // the buffer is resident twice over (--buffer-size sets it).
    let record = STACK_SAMPLE_HDR as u32 + cfg.stack_bytes;
    loader.max_entries(
        names::EVENTS,
        (record * 32).next_power_of_two().max(1 << 20),
    );
    let how = if args.sample > 1 {
        format!("one event in {} sampled", args.sample)
    } else {
        "every event".to_string()
    };
    // Copied by choice (the caller said why after a refusal).
    let why = match args.unwinder {
        Unwinder::Auto if copy_only => "; in-kernel unwinding refused",
        Unwinder::Auto if args.sample == 1 && system_wide => {
            "; system-wide, a process's first events would come before its unwind table"
        }
        _ => "",
    };
    say!(
        "memtrace: user stacks: dwarf{}, copied and unwound here ({} bytes of stack copied, {how}{why})",
        if auto { " (auto)" } else { "" },
        cfg.stack_bytes
    );
    Ok(Some(DwarfStacks::new(args.sample)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stacks::args::StackMode;

    /// Both ways of taking user stacks read the main thread's stack top
    /// through task->mm: the task offsets must be set whatever the tool sets.
    #[test]
    fn user_stacks_get_the_task_offsets_they_read_through() {
        for mode in [StackMode::Fp, StackMode::Dwarf] {
            let args = StackArgs {
                stack_mode: mode,
                stack_size: 4096,
                sample: 1,
                unwinder: Unwinder::Copy,
                unwind_table_size: 1 << 16,
            };
            let mut filter = Filter {
                stacks: stack_mode::USER,
                ..Default::default()
            };
            let mut loader = Loader::default();
            let dwarf = setup(Some((&args, false)), &mut filter, &mut loader, false).unwrap();
            assert_eq!(dwarf.is_some(), mode == StackMode::Dwarf);
            let names: Vec<_> = loader.global_names().collect();
            assert!(names.contains(&"TASK"), "{mode:?}: {names:?}");
            assert!(names.contains(&"USTACK"), "{mode:?}: {names:?}");
        }
    }
}
