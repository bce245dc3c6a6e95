//! The in-kernel unwinder's rows: each file's, compiled by userspace from
//! `.eh_frame`, found by binary search over the process's mappings and the
//! file's slice, and cached per CPU.

use aya_ebpf::{
    bindings::BPF_F_MMAPABLE,
    macros::map,
    maps::{Array, PerCpuArray},
};
use memtrace_common::kunwind::{
    mark, slice, RowCache, UnwindMapping, UnwindProc, UnwindRule, MAPPING_STEPS,
    MAX_UNWIND_MAPPINGS, ROW_CACHE_SLOTS, ROW_STEPS,
};

/// Every file's slice (`kunwind::slice`), in 4-byte words, two to an entry
/// (an array's entries are 8 bytes apart whatever their size); userspace
/// sizes it (`--unwind-table-size`) and writes it through a memory mapping.
#[map]
static UNWIND_ROWS: Array<u64> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// The rules rows name, each once; written by userspace like the rows.
#[map]
static UNWIND_RULES: Array<UnwindRule> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Rows found lately on this CPU (`RowCache`); userspace sizes it.
#[map]
static UNWIND_CACHE: PerCpuArray<RowCache> = PerCpuArray::with_max_entries(1, 0);

/// 1 when `a <= b`, 0 otherwise, without a branch: a branch per search step
/// would double the verifier's paths at each one.
#[inline(always)]
pub(super) fn le(a: u64, b: u64) -> u64 {
    (((b as i64).wrapping_sub(a as i64) >> 63) + 1) as u64
}

/// The mapping holding `pc`: the last one starting at or before it.
#[inline(always)]
fn find_mapping(p: &UnwindProc, pc: u64) -> Option<&UnwindMapping> {
    let nr = p.nr as u64;
    if nr == 0 || nr > MAX_UNWIND_MAPPINGS as u64 {
        return None;
    }
    let (mut lo, mut n) = (0u64, nr);
    for _ in 0..MAPPING_STEPS {
        let half = n >> 1;
        let mid = (lo + half) as usize & (MAX_UNWIND_MAPPINGS - 1);
        lo += half * le(p.maps[mid].start, pc);
        n -= half;
    }
    let m = &p.maps[lo as usize & (MAX_UNWIND_MAPPINGS - 1)];
    (m.start <= pc && pc < m.end).then_some(m)
}

/// Word `i` of the row array (little-endian: the even one is the low
/// half), 0 where there is none.
#[inline(always)]
fn word(i: u64) -> u64 {
    match UNWIND_ROWS.get((i >> 1) as u32) {
        Some(e) => (*e >> ((i & 1) << 5)) & 0xffff_ffff,
        None => 0,
    }
}

/// The rule for file-relative `rel` in the file slice at `s`: its page's
/// rows searched for the last one starting at or before it. Straight-line
/// (a failed read gives 0, which ends in the checks below): an early
/// return per read left a 6.1 verifier reading a stack slot one path had
/// not written.
#[inline(always)]
pub(super) fn find_rule(s: u32, rel: u64) -> Option<UnwindRule> {
    let s = s as u64;
    let page = (rel >> slice::PAGE_SHIFT).wrapping_sub(word(s + slice::FIRST_PAGE as u64));
    let pages = word(s + slice::PAGES as u64);
    let at = s + slice::STARTS as u64 + (page & 0xffff);
    let first = word(at);
    let n = word(at + 1).saturating_sub(first);
    if page >= pages || n == 0 {
        return None;
    }
    let key = rel & 0xffff;
    let (mut lo, mut n) = (s + first, n);
    // Fixed steps (a half of 0 changes nothing): an early exit would give
    // the verifier one more path per step. A page's first row is at 0.
    for _ in 0..ROW_STEPS {
        let half = n >> 1;
        lo += half * le(word(lo + half) >> 16, key);
        n -= half;
    }
    UNWIND_RULES.get((word(lo) & 0xffff) as u32).copied()
}

/// The row for `pc` in process `p` (`tgid`): from this CPU's cache of rows
/// found lately (which halves the added cost of faults' stacks, +955 to
/// +441 ns a fault), else searched and left there, then loaded from it. Returned straight from the search, the
/// row made the verifier's states differ at every frame, and it gave up.
/// Err: the mark to end the stack with.
#[inline(always)]
pub(super) fn row_for(p: &UnwindProc, tgid: u32, pc: u64) -> Result<UnwindRule, u64> {
    let slot = ((pc ^ (pc >> 13)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as u32
        & (ROW_CACHE_SLOTS - 1);
    let c = UNWIND_CACHE.get_ptr_mut(slot).ok_or(mark::NO_INFO)?;
    let hit = unsafe { (*c).pc == pc && (*c).tgid == tgid && (*c).gen == p.gen };
    if !hit {
        let m = find_mapping(p, pc).ok_or(mark::NO_TABLE)?;
        let rel = pc.wrapping_sub(m.bias);
        if m.nrows == 0 || rel > u32::MAX as u64 {
            return Err(mark::NO_INFO);
        }
        let rule = find_rule(m.rows, rel).ok_or(mark::NO_INFO)?;
        unsafe {
            *c = RowCache {
                pc,
                tgid,
                gen: p.gen,
                rule,
            }
        };
    }
    Ok(unsafe { (*c).rule })
}
