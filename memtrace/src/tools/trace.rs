//! `memtrace trace`: one line per event of any tracepoint, its fields
//! decoded by name and type from the format file, a filter tested in the
//! kernel (BCC's trace, `perf trace -e`, bpftrace's `printf(args)`).

use memtrace_common::{
    generic::{FieldRef, TraceHdr, MAX_COPY, TRACE_HDR},
    kind,
    names::{COUNT_TPS, EVENTS, TRACE_AT, TRACE_TP},
    stack_mode,
};

use crate::error::Result;
use crate::kernel::tracefs::Field;
use crate::output::{clock, Col, Printer, Row, Value};
use crate::probes::tpspec::{
    expand, own_fields, parse_filter, tracepoint_probes, FilterSpec, Selected, Spec,
};
use crate::run::tool::{About, Prep, Tool};
use crate::session::attach::Probe;
use crate::session::records::{comm, record};
use crate::stacks::args::StackArgs;
use crate::stacks::Traced;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::run::args::Common,
    /// Tracepoints as CATEGORY:NAME, wildcards allowed ('kmem:mm_page_*').
    #[arg(required = true, value_name = "TRACEPOINT")]
    pub patterns: Vec<String>,
    /// Show only events where 'FIELD OP VALUE' holds (OP: == != < <= > >= &),
    /// tested in the kernel; repeatable, all must hold.
    #[arg(long, value_parser = parse_filter)]
    pub filter: Vec<FilterSpec>,
    /// Print each event's user stack.
    #[arg(long)]
    pub stack: bool,
    /// Print each event's kernel stack.
    #[arg(long)]
    pub kernel_stack: bool,
    #[command(flatten)]
    pub stacks: StackArgs,
}

const COLS: [Col; 5] = [
    Col::text("time", "TIME", 8),
    Col::num("pid", "PID", 7),
    Col::text("comm", "COMM", 16),
    Col::text("tracepoint", "TRACEPOINT", 28),
    Col::text("args", "ARGS", 0),
];

pub struct Trace {
    args: Args,
    spec: Spec,
    selected: Vec<Selected>,
    /// `--json`: one column per field, named by it (leaked once per run).
    json_cols: Vec<Vec<Col>>,
    /// Per tracepoint, the offset of the field whose user string is copied.
    ustr: Vec<Option<u32>>,
    events: u64,
    truncated: u64,
}

impl Trace {
    pub fn new(a: &Args) -> Result<Self> {
        let spec = Spec {
            filters: a.filter.clone(),
            ..Default::default()
        };
        let selected = expand(&a.patterns)?;
        for (i, sel) in selected.iter().enumerate() {
            spec.config(i, sel, 0)?;
        }
        let json_cols = selected
            .iter()
            .map(|sel| {
                let mut c = vec![COLS[0], COLS[1], COLS[2], COLS[3]];
                for f in own_fields(&sel.format) {
                    let name: &'static str = Box::leak(f.name.clone().into_boxed_str());
                    c.push(Col::text(name, name, 0));
                }
                c
            })
            .collect();
        let ustr = selected
            .iter()
            .map(|s| user_string(s).map(|f| f.offset))
            .collect();
        Ok(Trace {
            ustr,
            args: a.clone(),
            spec,
            selected,
            json_cols,
            events: 0,
            truncated: 0,
        })
    }
}

/// Bytes of the record to copy: its fixed part, and room for the strings
/// `__data_loc` fields point to after it.
fn copy_size(sel: &Selected) -> u32 {
    let end = sel
        .format
        .fields
        .iter()
        .map(|f| f.offset + f.size)
        .max()
        .unwrap_or(8);
    let dynamic = sel
        .format
        .fields
        .iter()
        .any(|f| f.ty.contains("__data_loc") || f.ty.contains("__rel_loc"));
    let want = if dynamic { end + 256 } else { end };
    want.min(MAX_COPY as u32)
}

/// The field of a syscall tracepoint that points to a user string (a path,
/// a name): `trace` copies the string, not just the pointer. The first
/// such field; syscalls with two (rename) show the second as a pointer.
fn user_string(sel: &Selected) -> Option<&Field> {
    if sel.category != "syscalls" {
        return None;
    }
    own_fields(&sel.format).find(|f| f.ty.contains("char *") && f.size == 8)
}

/// One field of `rec` decoded by its type; `None` when it lies (partly)
/// past what was copied.
fn decode(f: &Field, rec: &[u8]) -> Option<(Value, bool)> {
    let (off, size) = (f.offset as usize, f.size as usize);
    let raw = rec.get(off..off + size)?;
    let num = |b: &[u8]| {
        let mut v = [0u8; 8];
        v[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(v)
    };
    let string = |b: &[u8]| {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    };
    if f.ty.contains("__data_loc") || f.ty.contains("__rel_loc") {
        let loc = num(&raw[..4.min(raw.len())]) as usize;
        let mut start = loc & 0xffff;
        if f.ty.contains("__rel_loc") {
            start += off + size;
        }
        let len = loc >> 16;
        let avail = rec.len().saturating_sub(start).min(len);
        let s = string(rec.get(start..start + avail).unwrap_or(&[]));
        return Some((s.into(), avail < len));
    }
    if f.ty.contains("char") && size > 1 && !f.ty.contains('*') {
        return Some((string(raw).into(), false));
    }
    if !matches!(size, 1 | 2 | 4 | 8) {
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        return Some((hex.into(), false));
    }
    let v = num(raw);
    let address = matches!(f.name.as_str(), "start" | "addr" | "ptr" | "call_site")
        || f.name.ends_with("_addr");
    if f.ty.contains('*') || f.name.ends_with("flags") || address {
        return Some((format!("{v:#x}").into(), false));
    }
    // Syscall formats declare every argument 8 bytes and unsigned; the C
    // type says how to read it (`int dfd` is -100, not 4294967196).
    // A descriptor is an int wherever the kernel looks it up, whatever the
    // format declares (`unsigned long fd` of mmap, `unsigned int fd` of
    // read): an anonymous mmap's fd is -1, not 4294967295.
    let descriptor = f.name == "fd"
        || f.name.ends_with("dfd")
        || f.name.starts_with("fd_")
        || matches!(f.name.as_str(), "oldfd" | "newfd" | "epfd" | "ufd");
    if descriptor && v >> 32 == 0 {
        return Some((Value::I(v as u32 as i32 as i64), false));
    }
    match f.ty.trim() {
        "int" | "pid_t" => return Some((Value::I(v as u32 as i32 as i64), false)),
        "long" | "off_t" | "loff_t" | "ssize_t" => return Some((Value::I(v as i64), false)),
        _ => {}
    }
    if f.signed {
        let shift = 64 - 8 * size as u32;
        let s = if shift == 0 {
            v as i64
        } else {
            ((v << shift) as i64) >> shift
        };
        return Some((Value::I(s), false));
    }
    Some((Value::U(v), false))
}

pub const ABOUT: About = About {
    name: "trace",
    help: "One line per event of any tracepoint, fields decoded from its format",
    traces: "tracepoint events",
    interval: None,
};

impl Tool for Trace {
    fn about(&self) -> &'static About {
        &ABOUT
    }
    fn what(&self) -> String {
        crate::probes::tpspec::what(&self.selected)
    }
    fn probes(&self) -> Vec<Probe> {
        tracepoint_probes(&self.selected, TRACE_TP, &TRACE_AT)
    }
    fn stack_mode(&self) -> u32 {
        let user = if self.args.stack { stack_mode::USER } else { 0 };
        user | if self.args.kernel_stack {
            stack_mode::KERNEL
        } else {
            0
        }
    }
    fn user_stacks(&self) -> Option<(&StackArgs, bool)> {
        // One line per event is printed anyway: a stack copy per event fits.
        self.args.stack.then_some((&self.args.stacks, true))
    }

    fn prepare(&mut self, k: &mut Prep) -> Result<()> {
        k.loader.max_entries(COUNT_TPS, self.selected.len() as u32);
        // Records carry the tracepoint's record: up to 1 KiB each.
        k.loader.max_entries(EVENTS, 4 << 20);
        Ok(())
    }

    fn on_start(&mut self, s: &mut Traced) -> Result<()> {
        for (i, sel) in self.selected.iter().enumerate() {
            let mut cfg = self.spec.config(i, sel, copy_size(sel))?;
            if let Some(f) = user_string(sel) {
                cfg.ustr = FieldRef {
                    offset: f.offset as u16,
                    size: 8,
                    signed: 0,
                };
            }
            s.set_array(COUNT_TPS, i as u32, cfg)?;
        }
        Ok(())
    }

    fn on_record(&mut self, data: &[u8], s: &mut Traced, out: &mut dyn Printer) -> Result<()> {
        let Some(h) = record::<TraceHdr>(data, kind::TRACE) else {
            return Ok(());
        };
        let Some(sel) = self.selected.get(h.index as usize) else {
            return Ok(());
        };
        self.events += 1;
        let end = TRACE_HDR + h.len as usize;
        let rec = data.get(TRACE_HDR..end).unwrap_or(&[]);
        let ustr = data.get(end..end + h.ustr_len as usize).map(|b| {
            let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            // No NUL within the copy: the string was longer.
            (String::from_utf8_lossy(&b[..n]).into_owned(), n == b.len())
        });
        let ustr_field = self.ustr.get(h.index as usize).copied().flatten();
        let head: [Value; 4] = [
            clock().into(),
            h.tgid.into(),
            comm(&h.comm).into(),
            sel.label().into(),
        ];
        let mut vals = Vec::new();
        let mut args = String::new();
        for f in own_fields(&sel.format) {
            let (v, cut) = match (&ustr, ustr_field) {
                (Some((text, cut)), Some(off)) if off == f.offset && h.ustr_len > 0 => {
                    (Value::S(text.clone()), *cut)
                }
                _ => decode(f, rec).unwrap_or((Value::Null, true)),
            };
            self.truncated += cut as u64;
            if !args.is_empty() {
                args.push(' ');
            }
            let mark = if cut { "..." } else { "" };
            match &v {
                Value::S(t) if f.ty.contains("char") => {
                    args.push_str(&format!("{}=\"{t}{mark}\"", f.name))
                }
                other => args.push_str(&format!("{}={other}", f.name)),
            }
            vals.push(v);
        }
        let (cols, row) = if self.args.common.json {
            let c = &self.json_cols[h.index as usize];
            (c.as_slice(), Row(head.into_iter().chain(vals).collect()))
        } else {
            (
                &COLS[..],
                Row(head.into_iter().chain([args.into()]).collect()),
            )
        };
        if self.stack_mode() == 0 {
            out.event("trace", cols, &row);
            return Ok(());
        }
        let mut frames = s.kernel_frames(h.kstack);
        if self.args.stack {
            frames.extend(s.thread_user_frames(h.tgid, Some(h.pid), h.ustack, 0));
        }
        if (self.args.stack && h.ustack == -1) || (self.args.kernel_stack && h.kstack < 0) {
            frames.push("[stack capture failed (counted in stack_fail)]".into());
        }
        out.event_stack("trace", cols, &row, &frames);
        Ok(())
    }

    fn events(&self) -> u64 {
        self.events
    }

    fn summary_extra(&self) -> Vec<(&'static str, Value)> {
        vec![("strings_truncated", self.truncated.into())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::tracefs::Format;

    // sys_enter_mmap as this machine's 6.18 kernel describes it.
    const SYS_ENTER_MMAP: &str = include_str!("../../tests/data/sys_enter_mmap.format");

    #[test]
    fn decodes_numbers_by_size_and_sign() {
        let f = Format::parse(SYS_ENTER_MMAP);
        let mut rec = vec![0u8; 64];
        let len = f.field("len").unwrap();
        rec[len.offset as usize..len.offset as usize + 8].copy_from_slice(&12288u64.to_le_bytes());
        // A signed 4-byte field (the kernel declares fd unsigned long).
        let nr = f.field("__syscall_nr").unwrap();
        rec[nr.offset as usize..nr.offset as usize + 4].copy_from_slice(&(-1i32).to_le_bytes());
        assert_eq!(decode(len, &rec).unwrap().0, Value::U(12288));
        assert_eq!(decode(nr, &rec).unwrap().0, Value::I(-1));
        assert!(decode(len, &rec[..20]).is_none(), "past the copy");
    }

    #[test]
    fn decodes_descriptors_as_ints() {
        let f = Format::parse(SYS_ENTER_MMAP);
        let fd = f.field("fd").unwrap();
        let mut rec = vec![0u8; 64];
        // What glibc's mmap(..., -1, 0) passes: the int zero-extended.
        rec[fd.offset as usize..fd.offset as usize + 8]
            .copy_from_slice(&0xffff_ffffu64.to_le_bytes());
        assert_eq!(decode(fd, &rec).unwrap().0, Value::I(-1));
        rec[fd.offset as usize..fd.offset as usize + 8].copy_from_slice(&3u64.to_le_bytes());
        assert_eq!(decode(fd, &rec).unwrap().0, Value::I(3));
    }

    #[test]
    fn decodes_data_loc_strings_and_marks_truncation() {
        let f = Field {
            name: "name".into(),
            ty: "__data_loc char[]".into(),
            offset: 8,
            size: 4,
            signed: false,
        };
        let mut rec = vec![0u8; 24];
        // "hello\0" at 16, length 6.
        rec[8..12].copy_from_slice(&((6u32 << 16) | 16).to_le_bytes());
        rec[16..22].copy_from_slice(b"hello\0");
        assert_eq!(decode(&f, &rec).unwrap(), ("hello".into(), false));
        assert_eq!(decode(&f, &rec[..19]).unwrap(), ("hel".into(), true));
    }
}
