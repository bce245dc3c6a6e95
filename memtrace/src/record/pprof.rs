//! pprof export: a record's stacks as a gzip'd `profile.proto` (the format
//! of google/pprof, read by `go tool pprof`, Pyroscope, Parca, Grafana and
//! Datadog). The messages are declared here with prost's derive, from the
//! published schema; no generated code and no protoc at build time.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use prost::Message;

use super::format::{Recording, Stack};
use super::report::summed;
use crate::error::Result;
use crate::output::frame::Frame;

#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
}

/// What a tool's samples measure, as (type, unit) pairs, and how to take
/// them from a stack.
fn sample_types(
    tool: &str,
    bytes: bool,
    heap: bool,
    all: bool,
) -> Vec<(&'static str, &'static str)> {
    match tool {
        _ if heap && all => vec![
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
        ],
        _ if heap => vec![("inuse_objects", "count"), ("inuse_space", "bytes")],
        "faults" => vec![("faults", "count")],
        "brkstack" => vec![("calls", "count"), ("bytes", "bytes")],
        _ if bytes => vec![("events", "count"), ("bytes", "bytes")],
        _ => vec![("events", "count")],
    }
}

pub(super) fn values(s: &Stack, n: usize) -> Vec<i64> {
    let clamp = |v: u64| v.min(i64::MAX as u64) as i64;
    let mut v = vec![clamp(s.count), clamp(s.bytes.unwrap_or(0))];
    if let Some(a) = s.alloc {
        v.extend([clamp(a[0]), clamp(a[1])]);
    }
    v.resize(n, 0);
    v
}

/// Interned strings, functions, mappings and locations.
#[derive(Default)]
struct Tables {
    strings: Vec<String>,
    by_string: HashMap<String, i64>,
    functions: Vec<Function>,
    by_function: HashMap<(i64, i64), u64>,
    mappings: Vec<Mapping>,
    by_module: HashMap<String, u64>,
    locations: Vec<Location>,
    by_frame: HashMap<(u64, u64, i64), u64>,
}

impl Tables {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.by_string.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_string());
        self.by_string.insert(s.to_string(), i);
        i
    }

    fn mapping(&mut self, module: &str, build_id: Option<&String>) -> u64 {
        if let Some(&id) = self.by_module.get(module) {
            return id;
        }
        let id = self.mappings.len() as u64 + 1;
        let m = Mapping {
            id,
            filename: self.string(module),
            build_id: build_id.map_or(0, |b| self.string(b)),
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
        };
        self.mappings.push(m);
        self.by_module.insert(module.to_string(), id);
        id
    }

    fn location(&mut self, f: &Frame, kernel: bool, build_ids: &HashMap<&str, &String>) -> u64 {
        let module = match (&f.module, kernel) {
            (Some(m), _) => m.as_str(),
            (None, true) => "[kernel.kallsyms]",
            (None, false) => "[unknown]",
        };
        let mapping_id = self.mapping(module, build_ids.get(module).copied());
        let name = self.string(&f.func);
        let file = f.file.as_deref().map_or(0, |s| self.string(s));
        let function_id = match self.by_function.get(&(name, file)) {
            Some(&id) => id,
            None => {
                let id = self.functions.len() as u64 + 1;
                self.functions.push(Function {
                    id,
                    name,
                    system_name: name,
                    filename: file,
                });
                self.by_function.insert((name, file), id);
                id
            }
        };
        let line = f.line.map_or(0, i64::from);
        if let Some(&id) = self.by_frame.get(&(mapping_id, function_id, line)) {
            return id;
        }
        let id = self.locations.len() as u64 + 1;
        self.locations.push(Location {
            id,
            mapping_id,
            // Frames are kept by function and line, not address.
            address: 0,
            line: vec![Line { function_id, line }],
        });
        self.by_frame.insert((mapping_id, function_id, line), id);
        id
    }
}

/// A stack's cgroup and, where its path names one, container and pod, as
/// (key, value) labels.
pub(super) fn group_labels(s: &Stack) -> Vec<(&'static str, String)> {
    let Some(g) = s.cgroup.as_deref().filter(|g| !g.is_empty()) else {
        return Vec::new();
    };
    let mut out = vec![("cgroup", g.to_string())];
    if let Some(c) = crate::process::container::of_cgroup(g) {
        out.push(("container_id", c.id));
        if let Some(pod) = c.pod_uid {
            out.push(("pod_uid", pod));
        }
    }
    out
}

/// The record's stacks summed over its reports, and what their samples
/// measure. Held memory is a state, not a flow: a record with a heap
/// report (memleak's, or memcg's and oomkill's `--heap` at a warning or a
/// kill) is profiled by the last kind of them alone, as pprof's in-use
/// types. memleak's `alloc_*` types come when it ran with `--all` (its
/// figures of what was allocated, freed or not).
pub(super) fn stacks_and_types(
    rec: &Recording,
) -> (Vec<&Stack>, Vec<(&'static str, &'static str)>) {
    let mut groups = summed(rec);
    let held = |g: &super::report::Group| g.stacks.iter().any(|s| s.alloc.is_some());
    let stacks: Vec<&Stack> = match groups.iter().rposition(held) {
        Some(i) => groups.swap_remove(i).stacks,
        None => groups.into_iter().flat_map(|g| g.stacks).collect(),
    };
    let bytes = stacks.iter().any(|s| s.bytes.is_some());
    let heap = stacks.iter().any(|s| s.alloc.is_some());
    let all = !stacks.is_empty()
        && stacks
            .iter()
            .all(|s| s.alloc.is_some_and(|a| a[4] & 1 != 0));
    let types = sample_types(&rec.header.tool, bytes, heap, all);
    (stacks, types)
}

/// The record's stacks summed over its reports, as a pprof profile.
pub fn profile(rec: &Recording) -> Profile {
    let (stacks, types) = stacks_and_types(rec);
    let mut t = Tables::default();
    t.string("");
    let build_ids: HashMap<&str, &String> =
        rec.build_ids.iter().map(|(m, b)| (m.as_str(), b)).collect();
    let sample_type = types
        .iter()
        .map(|(ty, unit)| ValueType {
            r#type: t.string(ty),
            unit: t.string(unit),
        })
        .collect();
    let (pid, comm) = (t.string("pid"), t.string("comm"));
    let mut samples = Vec::new();
    for s in stacks {
        // Leaf first, as pprof wants: the kernel's frames, then the user's.
        let kernel = s.kernel.iter().map(|f| (f, true));
        let user = s.user.iter().map(|f| (f, false));
        let location_id = kernel
            .chain(user)
            .map(|(f, k)| t.location(f, k, &build_ids))
            .collect();
        let mut label = vec![Label {
            key: comm,
            str: t.string(&s.comm),
            num: 0,
        }];
        // A stack merged from several processes is no one process's.
        if s.pid != 0 && s.processes <= 1 {
            label.push(Label {
                key: pid,
                str: 0,
                num: i64::from(s.pid),
            });
        }
        for (k, v) in group_labels(s) {
            label.push(Label {
                key: t.string(k),
                str: t.string(&v),
                num: 0,
            });
        }
        samples.push(Sample {
            location_id,
            value: values(s, types.len()),
            label,
        });
    }
    let comment = vec![t.string(&format!("memtrace {}", rec.header.args.join(" ")))];
    let duration = rec.trailer.as_ref().map_or(0.0, |tr| tr.duration_s);
    Profile {
        sample_type,
        sample: samples,
        mapping: t.mappings,
        location: t.locations,
        function: t.functions,
        string_table: t.strings,
        time_nanos: (rec.header.start * 1e9) as i64,
        duration_nanos: (duration * 1e9) as i64,
        comment,
        default_sample_type: 0,
    }
}

/// Writes `p` gzip'd to `path`, whole or not at all.
pub fn write(p: &Profile, path: &Path) -> Result<()> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&p.encode_to_vec())
        .and_then(|()| gz.finish())
        .and_then(|bytes| std::fs::write(path, bytes))
        .map_err(|e| super::write_error(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_types_follow_the_tool() {
        assert_eq!(
            sample_types("faults", false, false, false),
            [("faults", "count")]
        );
        assert_eq!(sample_types("memleak", true, true, true).len(), 4);
        assert_eq!(sample_types("memcg", true, true, false)[1].0, "inuse_space");
        assert_eq!(
            sample_types("brkstack", true, false, false)[1],
            ("bytes", "bytes")
        );
    }

    #[test]
    fn values_are_count_bytes_then_allocated() {
        let s = Stack {
            pid: 1,
            comm: "x".into(),
            count: 3,
            bytes: Some(300),
            user: vec![],
            kernel: vec![],
            note: None,
            processes: 1,
            alloc: Some([10, 1000, 7, 700, 0]),
            cgroup: None,
        };
        assert_eq!(values(&s, 4), [3, 300, 10, 1000]);
        assert_eq!(values(&s, 1), [3]);
    }
}
