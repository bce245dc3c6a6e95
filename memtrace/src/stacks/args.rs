//! `--stack-mode` and the other user-stack flags of the tools that print
//! user stacks: defined with the stacks they choose how to take.

use clap::Args;

/// How user stacks are taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StackMode {
    /// Walk frame pointers in the kernel: cheap, but stops at code built
    /// without them (glibc on most distributions).
    Fp,
    /// Unwind with the binaries' .eh_frame: complete stacks, in the kernel
    /// program with tables built from it, or here from a copy of the top of
    /// the user stack (`--unwinder`).
    Dwarf,
    /// dwarf (`--unwinder auto`); fp only where this kernel refuses the
    /// in-kernel unwinder and the events are too many to copy each stack.
    Auto,
}

/// User-stack arguments of the tools that print user stacks.
#[derive(Debug, Clone, Args)]
pub struct StackArgs {
    /// How user stacks are taken: fp, dwarf or auto.
    #[arg(long, value_enum, default_value_t = StackMode::Auto)]
    pub stack_mode: StackMode,
    /// dwarf: bytes of user stack copied per event (512 to 65536).
    #[arg(long, default_value_t = 16384, value_parser = parse_stack_size)]
    pub stack_size: u32,
    /// dwarf: copy the stack of one event in N; counts by stack become estimates.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub sample: u32,
    /// dwarf: where stacks are unwound: in the kernel program, with tables
    /// built from each file's .eh_frame (every event, nothing copied), or
    /// here, from a copy of the stack sent per event. auto: in the kernel,
    /// except with --sample and for rare events traced system-wide (brk,
    /// mmap, OOM kills: a process's first events come before its table, and
    /// a copy is complete); where this kernel refuses the unwinder, copied
    /// for rare events and frame pointers for the rest.
    #[arg(long, value_enum, default_value_t = Unwinder::Auto)]
    pub unwinder: Unwinder,
    /// dwarf in the kernel: bytes of locked kernel memory for unwind tables
    /// (4 bytes a row, each rule kept once; files that do not fit are left
    /// out, counted).
    #[arg(long, default_value = "32M", value_parser = parse_table_size)]
    pub unwind_table_size: u32,
}

/// Where `--stack-mode dwarf` unwinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Unwinder {
    Auto,
    Kernel,
    Copy,
}

/// `--unwind-table-size`, in 8-byte entries of the row array (two rows or
/// page starts each).
pub fn parse_table_size(s: &str) -> Result<u32, String> {
    match parse_size(s) {
        Ok(n) if (64 << 10..=1 << 30).contains(&n) => Ok((n / 8) as u32),
        _ => Err(format!("'{s}' is not a table size from 64K to 1G")),
    }
}

impl StackArgs {
    /// Whether to unwind with DWARF (before this kernel had a say).
    pub fn dwarf(&self) -> bool {
        match self.stack_mode {
            StackMode::Fp => false,
            StackMode::Dwarf => true,
            StackMode::Auto => true,
        }
    }

    /// What `auto` falls back to where this kernel refuses the in-kernel
    /// unwinder: a copy per event for rare events, frame pointers for the
    /// rest (a copy per fault costs microseconds).
    pub fn refused_fallback_is_fp(&self, rare: bool) -> bool {
        self.stack_mode == StackMode::Auto && !rare && self.sample == 1
    }

    /// Whether DWARF stacks are unwound in the kernel program (before this
    /// kernel had a say): every event, so never with `--sample`.
    pub fn in_kernel(&self, rare: bool, system_wide: bool) -> bool {
        self.dwarf()
            && self.sample == 1
            && match self.unwinder {
                Unwinder::Kernel => true,
                Unwinder::Copy => false,
                // System-wide, every process's first events come before
                // memtrace has read its maps: rare events (a process's few
                // brk calls, all at start-up) would mostly find no table,
                // and copying them costs little.
                Unwinder::Auto => !(rare && system_wide),
            }
    }
}

pub fn parse_stack_size(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if (512..=65536).contains(&n) => Ok(n & !7),
        _ => Err(format!("'{s}' is not a stack size from 512 to 65536 bytes")),
    }
}

/// A size in bytes: "512M", "5MiB", "1G", "4096"; K/M/G/T are powers of 1024.
/// A size, or 0 (where 0 means every one: `--heap-sample 0`).
pub fn parse_size_or_zero(s: &str) -> Result<u64, String> {
    match s.trim() {
        "0" => Ok(0),
        _ => parse_size(s),
    }
}

pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let num_end = lower
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(lower.len());
    let (num, unit) = lower.split_at(num_end);
    let mult: u64 = match unit.trim() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("'{s}' is not a size (try 512K, 8M, 1G)")),
    };
    match num.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok((v * mult as f64) as u64),
        _ => Err(format!("'{s}' is not a size (try 512K, 8M, 1G)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_sizes() {
        assert_eq!(parse_stack_size("16384").unwrap(), 16384);
        assert_eq!(parse_stack_size("1001").unwrap(), 1000);
        assert!(parse_stack_size("100").is_err());
        assert!(parse_stack_size("1000000").is_err());
    }
}
