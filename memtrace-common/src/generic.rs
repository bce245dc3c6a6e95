//! `count` and `trace`: one generic program for any tracepoint, configured
//! per tracepoint from its format file (fields by name, never compiled in).

use crate::TASK_COMM_LEN;

/// Key fields per tracepoint (`--by FIELD`).
pub const MAX_KEY_FIELDS: usize = 3;
/// Predicates per tracepoint (`--filter`), all of which must hold.
pub const MAX_FILTERS: usize = 4;
/// Bytes of a record `trace` copies at most (fields and `__data_loc` data).
pub const MAX_COPY: usize = 1024;
/// Bytes of a user string a syscall argument points to that `trace` copies
/// after the record (a path, a name).
pub const MAX_USTR: usize = 256;

/// A field of the record: where it is and how to widen it to 64 bits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FieldRef {
    pub offset: u16,
    /// 1, 2, 4 or 8 bytes; 0 for no field.
    pub size: u8,
    pub signed: u8,
}

/// What else a count is keyed by (`--by pid,tid,comm,cgroup`); stacks are
/// asked for through `Filter.stacks`.
pub mod by {
    pub const PID: u32 = 1;
    pub const TID: u32 = 2;
    pub const COMM: u32 = 4;
    pub const CGROUP: u32 = 8;
}

/// Comparison of a `--filter` predicate; 0 is an unused slot.
pub mod op {
    pub const EQ: u32 = 1;
    pub const NE: u32 = 2;
    pub const LT: u32 = 3;
    pub const LE: u32 = 4;
    pub const GT: u32 = 5;
    pub const GE: u32 = 6;
    /// Any of the value's bits set (`FIELD & MASK`).
    pub const AND: u32 = 7;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Predicate {
    pub field: FieldRef,
    pub op: u32,
    pub value: u64,
}

/// One matched tracepoint's configuration, keyed by its event id (the
/// record's `common_type`): one program serves every tracepoint.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TpConfig {
    /// The tracepoint's place in userspace's list.
    pub index: u32,
    pub by: u32,
    pub keys: [FieldRef; MAX_KEY_FIELDS],
    pub sum: FieldRef,
    /// `trace`: a field holding a pointer to a user string (a syscall's
    /// `const char *`), copied after the record.
    pub ustr: FieldRef,
    pub _pad: u32,
    pub filters: [Predicate; MAX_FILTERS],
    /// `trace`: bytes of the record to copy (at most `MAX_COPY`).
    pub copy: u32,
    /// Set by userspace once the entry is written: the array's entries
    /// exist (zeroed) from the start, and an event that fires between
    /// attach and configuration must not be taken for tracepoint 0.
    pub valid: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CountKey {
    pub index: u32,
    pub tgid: u32,
    pub tid: u32,
    pub ustack: i32,
    pub kstack: i32,
    /// More bits of a walked user stack's hash (see `StackKey`).
    pub ustack_check: u32,
    /// The count generation (see `Generational`).
    pub gen: u32,
    pub _pad: u32,
    pub cgroup: u64,
    pub fields: [u64; MAX_KEY_FIELDS],
    pub comm: [u8; TASK_COMM_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CountVal {
    pub count: u64,
    /// `--sum FIELD`.
    pub sum: u64,
    pub comm: [u8; TASK_COMM_LEN],
}

/// Header of a `kind::TRACE` record; `len` bytes of the tracepoint's record
/// follow it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceHdr {
    pub kind: u32,
    pub index: u32,
    pub tgid: u32,
    pub pid: u32,
    pub ustack: i32,
    pub kstack: i32,
    pub len: u32,
    /// Bytes of the user string after the record, its NUL included; 0 for none.
    pub ustr_len: u32,
    pub comm: [u8; TASK_COMM_LEN],
}

pub const TRACE_HDR: usize = core::mem::size_of::<TraceHdr>();

impl FieldRef {
    /// The field's value from the 8 bytes read at its offset (little
    /// endian): the bytes past its size dropped, a signed value extended.
    #[inline(always)]
    pub fn widen(&self, raw: u64) -> u64 {
        let shift = 64 - 8 * (self.size as u32 & 15).min(8);
        if shift == 0 || shift == 64 {
            return if shift == 64 { 0 } else { raw };
        }
        if self.signed != 0 {
            (((raw << shift) as i64) >> shift) as u64
        } else {
            (raw << shift) >> shift
        }
    }
}

impl Predicate {
    /// Whether `v` (widened by `widen`) satisfies the predicate.
    #[inline(always)]
    pub fn holds(&self, v: u64) -> bool {
        let signed = self.field.signed != 0;
        let lt = |a: u64, b: u64| {
            if signed {
                (a as i64) < (b as i64)
            } else {
                a < b
            }
        };
        match self.op {
            op::EQ => v == self.value,
            op::NE => v != self.value,
            op::LT => lt(v, self.value),
            op::LE => !lt(self.value, v),
            op::GT => lt(self.value, v),
            op::GE => !lt(v, self.value),
            op::AND => v & self.value != 0,
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(size: u8, signed: u8) -> FieldRef {
        FieldRef {
            offset: 0,
            size,
            signed,
        }
    }

    #[test]
    fn widening_keeps_the_fields_bytes_and_sign() {
        assert_eq!(f(1, 0).widen(0xAABB_CCFF), 0xFF);
        assert_eq!(f(1, 1).widen(0xAABB_CCFF), u64::MAX);
        assert_eq!(f(2, 0).widen(0x1234_5678), 0x5678);
        assert_eq!(f(4, 1).widen(0xFFFF_FFFE), (-2i64) as u64);
        assert_eq!(f(4, 0).widen(0x1_FFFF_FFFE), 0xFFFF_FFFE);
        assert_eq!(f(8, 1).widen(7), 7);
        assert_eq!(f(0, 0).widen(7), 0);
    }

    #[test]
    fn predicates_compare_signed_fields_as_signed() {
        let p = |op, value, signed| Predicate {
            field: f(8, signed),
            op,
            value,
        };
        assert!(p(op::LT, 0, 1).holds((-1i64) as u64));
        assert!(!p(op::LT, 0, 0).holds((-1i64) as u64));
        assert!(p(op::GE, 4096, 0).holds(4096));
        assert!(!p(op::GT, 4096, 0).holds(4096));
        assert!(p(op::LE, 4096, 0).holds(4096));
        assert!(p(op::NE, 1, 0).holds(2));
        assert!(p(op::AND, 0x4, 0).holds(0x6));
        assert!(!p(op::AND, 0x1, 0).holds(0x6));
    }
}

crate::names! {
    maps {
        COUNT_TPS: u32 => TpConfig, OnDemand;
        COUNTS: CountKey => CountVal, OnDemand;
        TRACE_SCRATCH: () => (), Compiled;
    }
    globals {}
    progs {
        COUNT_TP = count_tp,
        COUNT_ONE = count_one,
        COUNT_AT1 = count_at1,
        COUNT_AT2 = count_at2,
        COUNT_AT3 = count_at3,
        COUNT_AT4 = count_at4,
        COUNT_AT5 = count_at5,
        COUNT_AT6 = count_at6,
        COUNT_AT7 = count_at7,
        TRACE_TP = trace_tp,
        TRACE_ONE = trace_one,
        TRACE_AT1 = trace_at1,
        TRACE_AT2 = trace_at2,
        TRACE_AT3 = trace_at3,
        TRACE_AT4 = trace_at4,
        TRACE_AT5 = trace_at5,
        TRACE_AT6 = trace_at6,
        TRACE_AT7 = trace_at7,
    }
    /// For kernels without attach cookies (before 5.15): count's and
    /// trace's program for each place in the list of tracepoints.
    pub const COUNT_AT: [Prog; 8] = [
        COUNT_ONE, COUNT_AT1, COUNT_AT2, COUNT_AT3, COUNT_AT4, COUNT_AT5, COUNT_AT6, COUNT_AT7,
    ];
    pub const TRACE_AT: [Prog; 8] = [
        TRACE_ONE, TRACE_AT1, TRACE_AT2, TRACE_AT3, TRACE_AT4, TRACE_AT5, TRACE_AT6, TRACE_AT7,
    ];
}

crate::pod!(TpConfig, CountKey, CountVal, TraceHdr);
