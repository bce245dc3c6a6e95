//! In-kernel DWARF unwinding (`--stack-mode dwarf` with tables): the user
//! stack is unwound here, frame by frame, with rows userspace compiled from
//! each file's `.eh_frame`, and stored like a frame-pointer walk's (same
//! scratch, ids and map), so nothing per event crosses the ring buffer.

use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_NOEXIST},
    cty::c_void,
    helpers::generated::bpf_probe_read_user,
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use memtrace_common::{
    kunwind::{
        mark, row, stat, RowCache, UnwindMapping, UnwindProc, UnwindRow, MAPPING_STEPS,
        MAX_UNWIND_MAPPINGS, ROW_CACHE_SLOTS, ROW_STEPS,
    },
    loss, stack_mode,
    stacks::MAX_UFRAMES,
};

use super::{
    emit::{count_loss, emit},
    filter::{current_tgid, FILTER},
    reads::{stack_top, user_regs},
    stacks::USTACK,
    walk::{WALK_SCRATCH, WINDOW},
    NO_PREALLOC,
};

/// Every file's rows, each file a slice; userspace sizes it
/// (`--unwind-table-size`) and writes it through a memory mapping.
#[map]
static UNWIND_ROWS: Array<UnwindRow> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Per process, its executable mappings and their slices of the rows.
#[map]
static UNWIND_PROCS: HashMap<u32, UnwindProc> = HashMap::with_max_entries(1, NO_PREALLOC);

/// Processes whose pc was in no mapping memtrace knows: their maps are read
/// again, and the entry removed once done (one record until then).
#[map]
static UNWIND_MISSES: HashMap<u32, u8> = HashMap::with_max_entries(1, NO_PREALLOC);

/// Rows found lately on this CPU (`RowCache`); userspace sizes it.
#[map]
static UNWIND_CACHE: PerCpuArray<RowCache> = PerCpuArray::with_max_entries(1, 0);

/// How each unwind ended (`kunwind::stat`).
#[map]
static UNWIND_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::NR, 0);

/// A forked child runs its parent's code at its parent's addresses: it
/// starts with its parent's table, in place before its first event
/// (userspace reads its maps only when the fork's record arrives).
#[inline(always)]
pub(super) fn inherit_table(parent: u32, child: u32) {
    if let Some(p) = unsafe { UNWIND_PROCS.get(&parent) } {
        // Full: the child's stacks end "no table" and it is read as missed.
        let _ = UNWIND_PROCS.insert(&child, p, 0);
    }
}

/// A process that exec'd runs a new image: the old table would unwind its
/// code wrongly. None until userspace has read the new maps (the first
/// stack without one asks for it).
#[inline(always)]
pub(super) fn drop_table(tgid: u32) {
    let _ = UNWIND_PROCS.remove(&tgid);
}

#[inline(always)]
fn count(what: u32) {
    if let Some(p) = UNWIND_STATS.get_ptr_mut(what) {
        unsafe { *p += 1 };
    }
}

/// 1 when `a <= b`, 0 otherwise, without a branch: a branch per search step
/// would double the verifier's paths at each one.
#[inline(always)]
fn le(a: u64, b: u64) -> u64 {
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

/// The row for file-relative `rel` in `[first, first + n)`: the last one
/// starting at or before it.
#[inline(always)]
fn find_row(first: u32, n: u32, rel: u64) -> Option<UnwindRow> {
    let (mut lo, mut n) = (first as u64, n as u64);
    let r0 = UNWIND_ROWS.get(lo as u32)?;
    if r0.pc as u64 > rel {
        return None;
    }
    // Fixed steps (a half of 0 changes nothing): an early exit would give
    // the verifier one more path per step.
    for _ in 0..ROW_STEPS {
        let half = n >> 1;
        let pc = match UNWIND_ROWS.get((lo + half) as u32) {
            Some(r) => r.pc as u64,
            None => u64::MAX,
        };
        lo += half * le(pc, rel);
        n -= half;
    }
    UNWIND_ROWS.get(lo as u32).copied()
}

/// Whether rows found earlier are used again. Off: with the check,
/// brkstack's program was too complex for the verifier (faults' passed).
const CACHE: bool = false;

/// The row for `pc` in process `p` (`tgid`): searched and left in this
/// CPU's slot, then loaded from it. Returned straight from the search, the
/// row made the verifier's states differ at every frame, and it gave up.
/// Err: the mark to end the stack with.
#[inline(always)]
fn row_for(p: &UnwindProc, tgid: u32, pc: u64) -> Result<UnwindRow, u64> {
    let slot = ((pc ^ (pc >> 13)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as u32
        & (ROW_CACHE_SLOTS - 1);
    let c = UNWIND_CACHE.get_ptr_mut(slot).ok_or(mark::NO_INFO)?;
    let hit = CACHE && unsafe { (*c).pc == pc && (*c).tgid == tgid && (*c).gen == p.gen };
    if !hit {
        let m = find_mapping(p, pc).ok_or(mark::NO_TABLE)?;
        let rel = pc.wrapping_sub(m.bias);
        if m.nrows == 0 || rel > u32::MAX as u64 {
            return Err(mark::NO_INFO);
        }
        let row = find_row(m.rows, m.nrows, rel).ok_or(mark::NO_INFO)?;
        unsafe {
            *c = RowCache {
                pc,
                tgid,
                gen: p.gen,
                row,
            }
        };
    }
    Ok(unsafe { (*c).row })
}

/// The top of the user stack copied once (most frames' words are read from
/// there), from `base` for `len` bytes.
struct Copy {
    buf: *mut u8,
    base: u64,
    len: u64,
}

impl Copy {
    /// The word at `addr`: from the copy when it is there, else read into
    /// the slot just past it. Either way one load from the buffer: a path
    /// that kept the word on the stack instead made the verifier's states
    /// differ at every frame, and it gave up.
    #[inline(always)]
    fn word(&self, addr: u64) -> Option<u64> {
        let off = addr.wrapping_sub(self.base);
        let at = if addr & 7 == 0 && off + 8 <= self.len && off < WINDOW as u64 {
            off as usize & (WINDOW - 1)
        } else {
            let r = unsafe {
                bpf_probe_read_user(
                    self.buf.add(WINDOW) as *mut c_void,
                    8,
                    addr as *const c_void,
                )
            };
            if r != 0 {
                return None;
            }
            WINDOW
        };
        // 8-aligned in an 8-aligned buffer: one load.
        Some(unsafe { (self.buf.add(at) as *const u64).read() })
    }
}

/// `unwind_user_stack` as a global BPF function: the verifier checks it
/// once, on its own, not once per path of every program that calls it.
/// Returns the stack id in the high half, the hash bits in the low.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn memtrace_unwind_user_stack() -> u64 {
    // Kernels before about 6.8 verify a global function even where no call
    // reaches it, with this run's constants: without the unwinder its
    // offsets are unset, and the rest is dead code only behind this test.
    if FILTER.load().stacks & stack_mode::KUNWIND == 0 {
        return (u32::MAX as u64) << 32;
    }
    let (id, check) = unwind_user_stack();
    ((id as u32 as u64) << 32) | check as u64
}

/// Unwinds the current task's user stack into the walk's scratch, ending
/// with a `mark` frame when it stops early. Returns its id and more bits of
/// its hash, as `walk_user_stack`.
#[inline(always)]
fn unwind_user_stack() -> (i32, u32) {
    let cfg = USTACK.load();
    let Some(s) = WALK_SCRATCH.get_ptr_mut(0) else {
        return (-1, 0);
    };
    let (mut ip, mut sp, mut bp) = user_regs(&cfg);
    // One read of the stack in use, up to the main thread's stack top (a
    // thread's top is unknown: the rest of sp's page), far cheaper than a
    // read per word.
    let base = sp & !7;
    let top = stack_top(&cfg);
    let mut want = if top > base {
        top - base
    } else {
        4096 - (base & 4095)
    };
    if want > WINDOW as u64 {
        want = WINDOW as u64;
    }
    // Opaque, so that LLVM keeps the bound as the walk's does (6.1).
    let want = core::hint::black_box(want);
    let buf = unsafe { (*s).stack.as_mut_ptr() };
    let mut copy = Copy { buf, base, len: 0 };
    if want <= WINDOW as u64
        && unsafe { bpf_probe_read_user(buf as *mut c_void, want as u32, base as *const c_void) }
            == 0
    {
        copy.len = want;
    }
    let f = unsafe { &mut (*s).frames };
    let tgid = current_tgid();
    f.ips[0] = ip;
    let mut nr = 1usize;
    let mut end = mark::TRUNCATED;
    let proc_ = unsafe { UNWIND_PROCS.get(&tgid) };
    for i in 1..MAX_UFRAMES {
        let Some(p) = proc_ else {
            end = mark::NO_TABLE;
            break;
        };
        // A return address is just past its call: look up the call itself
        // (a call can be a function's last instruction).
        let pc = if i == 1 { ip } else { ip - 1 };
        let r = match row_for(p, tgid, pc) {
            Ok(r) => r,
            Err(e) => {
                end = e;
                break;
            }
        };
        let cfa = match r.kind {
            row::RSP => sp.wrapping_add(r.cfa_off as i64 as u64),
            row::RBP => bp.wrapping_add(r.cfa_off as i64 as u64),
            row::PLT => sp + 8 + (le(r.cfa_off as u64, ip & 15) << 3),
            row::END => {
                end = 0;
                break;
            }
            _ => {
                end = mark::NO_INFO;
                break;
            }
        };
        let Some(ra) = copy.word(cfa.wrapping_sub(8)) else {
            end = mark::READ_FAIL;
            break;
        };
        if r.rbp_off != 0 {
            match copy.word(cfa.wrapping_add((r.rbp_off as i64 * 8) as u64)) {
                Some(v) => bp = v,
                None => {
                    end = mark::READ_FAIL;
                    break;
                }
            }
        }
        // The end of the stack, or a frame that does not go up it.
        if ra == 0 || cfa <= sp {
            end = 0;
            break;
        }
        f.ips[i] = ra;
        nr = i + 1;
        ip = ra;
        sp = cfa;
    }
    let (what, end) = match end {
        0 => (stat::COMPLETE, 0),
        mark::TRUNCATED => (stat::TRUNCATED, mark::TRUNCATED),
        mark::NO_TABLE => (stat::NO_TABLE, mark::NO_TABLE),
        mark::READ_FAIL => (stat::READ_FAIL, mark::READ_FAIL),
        _ => (stat::NO_INFO, mark::NO_INFO),
    };
    count(what);
    if end != 0 {
        // In the last slot when the stack fills them all.
        let at = if nr >= MAX_UFRAMES {
            MAX_UFRAMES - 1
        } else {
            nr
        };
        f.ips[at] = end;
        nr = at + 1;
        if end == mark::TRUNCATED {
            count_loss(loss::STACK_TRUNCATED);
        }
        if end == mark::NO_TABLE && UNWIND_MISSES.insert(&tgid, &1, BPF_NOEXIST as u64).is_ok() {
            emit(&memtrace_common::kunwind::UnwindMiss {
                kind: memtrace_common::kind::UNWIND_MISS,
                tgid,
            });
        }
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for i in 0..MAX_UFRAMES {
        if i >= nr {
            break;
        }
        h = (h ^ f.ips[i]).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ nr as u64).wrapping_mul(0x0000_0100_0000_01b3);
    f.hash = h;
    f.nr = nr as u32;
    (
        ((h ^ (h >> 32)) as u32 & 0x7fff_ffff) as i32,
        (h >> 32) as u32,
    )
}
