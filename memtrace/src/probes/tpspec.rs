//! Tracepoints chosen by name or wildcard (`vmscan:*`), and the fields,
//! sums and filters of `count` and `trace` resolved against each one's
//! format file: nothing about a tracepoint's layout is compiled in.

use memtrace_common::generic::{op, FieldRef, Predicate, TpConfig, MAX_FILTERS, MAX_KEY_FIELDS};
use wildmatch::WildMatch;

use crate::session::attach::{Probe, Prog};

use crate::error::{Error, Result};
use crate::kernel::tracefs::{self, Field, Format};

/// One matched tracepoint.
#[derive(Debug, Clone)]
pub struct Selected {
    pub category: String,
    pub name: String,
    /// Its event id: the `common_type` of its records.
    pub id: u32,
    pub format: Format,
}

impl Selected {
    pub fn label(&self) -> String {
        format!("{}:{}", self.category, self.name)
    }
}

fn usage(msg: String) -> Error {
    Error::Usage(msg)
}

/// `, did you mean X?` for the candidate closest to `what`, if any is close.
fn closest<'a>(what: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    let best = candidates
        .into_iter()
        .map(|c| (strsim::levenshtein(what, c), c))
        .min();
    match best {
        Some((d, c)) if d <= what.len().max(3) / 2 + 1 => format!("; did you mean {c}?"),
        _ => String::new(),
    }
}

fn dirs(path: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    v.sort();
    v
}

/// Every tracepoint matching any of `patterns` (`CATEGORY:NAME`, either part
/// may hold `*` and `?`; `t:` and `tracepoint:` prefixes as in BCC and
/// bpftrace), in tracefs order, each once.
pub fn expand(patterns: &[String]) -> Result<Vec<Selected>> {
    let events = tracefs::root()?.join("events");
    let categories = dirs(&events);
    let mut out: Vec<Selected> = Vec::new();
    for p in patterns {
        let bare = p
            .strip_prefix("tracepoint:")
            .or_else(|| p.strip_prefix("t:"))
            .unwrap_or(p);
        let Some((cat, name)) = bare.split_once(':') else {
            return Err(usage(format!(
                "'{p}' is not a tracepoint: expected CATEGORY:NAME, such as kmem:kmalloc or 'vmscan:*'"
            )));
        };
        let (cm, nm) = (WildMatch::new(cat), WildMatch::new(name));
        let mut found = false;
        let mut all = Vec::new();
        for c in categories.iter() {
            for n in dirs(&events.join(c)) {
                if cm.matches(c) && nm.matches(&n) {
                    found = true;
                    if !out.iter().any(|s| s.category == *c && s.name == n) {
                        out.push(select(c, &n)?);
                    }
                } else if !found {
                    all.push(format!("{c}:{n}"));
                }
            }
        }
        if !found {
            let hint = closest(bare, all.iter().map(String::as_str));
            return Err(usage(format!("no tracepoint matches '{p}'{hint}")));
        }
    }
    // Without cookies a program per place in the list tells them apart.
    let most = memtrace_common::names::COUNT_AT.len();
    if out.len() > most && !crate::kernel::feature::attach_cookies() {
        return Err(usage(format!(
            "{} tracepoints match: without BPF attach cookies (Linux 5.15) memtrace takes up to {most} in one run",
            out.len()
        )));
    }
    Ok(out)
}

fn select(category: &str, name: &str) -> Result<Selected> {
    let dir = tracefs::root()?.join("events").join(category).join(name);
    let id = std::fs::read_to_string(dir.join("id"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| Error::NoTracepoint {
            category: category.into(),
            name: name.into(),
        })?;
    Ok(Selected {
        category: category.into(),
        name: name.into(),
        id,
        format: Format::load(category, name)?,
    })
}

/// "kmem:kmalloc events", or "events of 19 tracepoints": for the banner.
pub fn what(selected: &[Selected]) -> String {
    match selected {
        [one] => format!("{} events", one.label()),
        many => format!("events of {} tracepoints", many.len()),
    }
}

/// One probe per tracepoint, each with its place in the list as cookie;
/// without cookies (before Linux 5.15), through the program for its place
/// (`at`: up to eight tracepoints).
pub fn tracepoint_probes(selected: &[Selected], many: Prog, at: &[Prog]) -> Vec<Probe> {
    selected
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let p = match crate::kernel::feature::attach_cookies() {
                true => Probe::new(s.label())
                    .tracepoint(many, s.category.clone(), s.name.clone())
                    .cookie(i as u64),
                false => Probe::new(s.label()),
            };
            match at.get(i) {
                Some(&one) => p.tracepoint(one, s.category.clone(), s.name.clone()),
                None => p,
            }
        })
        .collect()
}

/// Fields of the record proper, without the `common_*` header.
pub fn own_fields(f: &Format) -> impl Iterator<Item = &Field> {
    f.fields.iter().filter(|f| !f.name.starts_with("common_"))
}

/// A field usable as a number (key, sum or filter): a scalar of 1 to 8 bytes.
pub fn numeric(sel: &Selected, name: &str) -> Result<FieldRef> {
    let Some(f) = sel.format.field(name) else {
        let hint = closest(name, own_fields(&sel.format).map(|f| f.name.as_str()));
        return Err(usage(format!(
            "tracepoint {} has no field '{name}'{hint}",
            sel.label()
        )));
    };
    let scalar =
        matches!(f.size, 1 | 2 | 4 | 8) && !f.ty.contains('[') && !f.ty.contains("__data_loc");
    if !scalar || f.offset > u16::MAX as u32 {
        return Err(usage(format!(
            "field '{name}' of {} is '{}': only numeric fields can key, sum or filter",
            sel.label(),
            f.ty
        )));
    }
    Ok(FieldRef {
        offset: f.offset as u16,
        size: f.size as u8,
        signed: f.signed as u8,
    })
}

/// A `--filter 'FIELD OP VALUE'` before it meets a tracepoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterSpec {
    pub field: String,
    pub op: u32,
    pub value: u64,
    /// The value was written negative: meaningless for an unsigned field.
    pub negative: bool,
}

const OPS: [(&str, u32); 7] = [
    ("==", op::EQ),
    ("!=", op::NE),
    ("<=", op::LE),
    (">=", op::GE),
    ("<", op::LT),
    (">", op::GT),
    ("&", op::AND),
];

/// Parses `FIELD OP VALUE` (spaces optional); VALUE is decimal, negative
/// or `0x` hex.
pub fn parse_filter(s: &str) -> std::result::Result<FilterSpec, String> {
    let bad = || {
        format!("'{s}' is not a filter: expected FIELD OP VALUE with OP one of == != < <= > >= &, such as 'len > 4096'")
    };
    let (at, sym, op) = OPS
        .iter()
        .filter_map(|(sym, op)| s.find(sym).map(|at| (at, *sym, *op)))
        .min_by_key(|(at, sym, _)| (*at, std::cmp::Reverse(sym.len())))
        .ok_or_else(bad)?;
    let field = s[..at].trim();
    let value = s[at + sym.len()..].trim();
    let valid = !field.is_empty() && field.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(bad());
    }
    let negative = value.starts_with('-');
    let value = parse_number(value).ok_or_else(bad)?;
    Ok(FilterSpec {
        field: field.into(),
        op,
        value,
        negative,
    })
}

fn parse_number(v: &str) -> Option<u64> {
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else if let Some(n) = v.strip_prefix('-') {
        n.parse::<u64>()
            .ok()
            .filter(|n| *n <= i64::MAX as u64)
            .map(|n| (n as i64).wrapping_neg() as u64)
    } else {
        v.parse().ok()
    }
}

/// What `count` and `trace` ask of every matched tracepoint.
#[derive(Debug, Clone, Default)]
pub struct Spec {
    pub by: u32,
    pub keys: Vec<String>,
    pub sum: Option<String>,
    pub filters: Vec<FilterSpec>,
}

impl Spec {
    /// The configuration of tracepoint `index` of the list; an error naming
    /// the tracepoint when one of its fields is missing or not a number.
    pub fn config(&self, index: usize, sel: &Selected, copy: u32) -> Result<TpConfig> {
        if self.keys.len() > MAX_KEY_FIELDS {
            return Err(usage(format!(
                "at most {MAX_KEY_FIELDS} fields can key a count"
            )));
        }
        if self.filters.len() > MAX_FILTERS {
            return Err(usage(format!("at most {MAX_FILTERS} filters can be given")));
        }
        let mut c = TpConfig {
            index: index as u32,
            by: self.by,
            copy,
            valid: 1,
            ..Default::default()
        };
        for (slot, k) in c.keys.iter_mut().zip(&self.keys) {
            *slot = numeric(sel, k)?;
        }
        if let Some(s) = &self.sum {
            c.sum = numeric(sel, s)?;
        }
        for (slot, f) in c.filters.iter_mut().zip(&self.filters) {
            let field = numeric(sel, &f.field)?;
            if f.negative && field.signed == 0 {
                return Err(usage(format!(
                    "field '{}' of {} is unsigned: '{}' can never compare with a negative value",
                    f.field,
                    sel.label(),
                    f.field
                )));
            }
            *slot = Predicate {
                field,
                op: f.op,
                value: f.value,
            };
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_with_or_without_spaces() {
        let f = parse_filter("len > 4096").unwrap();
        assert_eq!((f.field.as_str(), f.op, f.value), ("len", op::GT, 4096));
        let f = parse_filter("bytes_alloc>=0x1000").unwrap();
        assert_eq!(
            (f.field.as_str(), f.op, f.value),
            ("bytes_alloc", op::GE, 4096)
        );
        let f = parse_filter("ret != -12").unwrap();
        assert_eq!((f.op, f.value), (op::NE, (-12i64) as u64));
        let f = parse_filter("flags & 0x4").unwrap();
        assert_eq!((f.op, f.value), (op::AND, 4));
        assert_eq!(parse_filter("a<=1").unwrap().op, op::LE);
        assert_eq!(parse_filter("a==1").unwrap().op, op::EQ);
    }

    #[test]
    fn bad_filters_are_errors() {
        for s in [
            "len",
            "len > ",
            "> 5",
            "len > five",
            "le n > 5",
            "len ~ 5",
            "",
        ] {
            assert!(parse_filter(s).is_err(), "{s}");
        }
    }

    #[test]
    fn closest_names_a_near_miss_only() {
        let c = ["kmem:kmalloc", "kmem:kfree", "vmscan:mm_vmscan_kswapd_wake"];
        assert_eq!(closest("kmem:kmaloc", c), "; did you mean kmem:kmalloc?");
        assert_eq!(closest("zzzzzzzz:qqqqqq", c), "");
    }
}
