//! OpenTelemetry profiles export: a record's stacks as OTLP `ProfilesData`
//! (opentelemetry-proto's `profiles/v1development`, the alpha that
//! Pyroscope 2 and the Collector ingest), in protobuf. The same body is an
//! `ExportProfilesServiceRequest`. Messages are declared with prost's
//! derive from the published schema, as for pprof (`otlp_proto.rs`).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::io::Write;
use std::path::Path;

use prost::Message;

use super::format::{Recording, Stack as RecStack};
use super::otlp_proto::*;
use super::pprof::{group_labels, stacks_and_types, values};
use crate::error::Result;
use crate::output::frame::Frame;

/// Items by value, each once, index 0 the zero item (the schema's rule for
/// every dictionary table).
struct Table<K, V> {
    items: Vec<V>,
    at: HashMap<K, i32>,
}

impl<K: Hash + Eq, V: Default> Table<K, V> {
    fn new() -> Self {
        Table {
            items: vec![V::default()],
            at: HashMap::new(),
        }
    }

    fn index(&mut self, k: K, make: impl FnOnce() -> V) -> i32 {
        if let Some(&i) = self.at.get(&k) {
            return i;
        }
        let i = self.items.len() as i32;
        self.items.push(make());
        self.at.insert(k, i);
        i
    }
}

/// An attribute's value as the dictionary keys it.
#[derive(Hash, PartialEq, Eq)]
enum Val {
    Str(String),
    Int(i64),
}

struct Dict {
    strings: Table<String, String>,
    mappings: Table<String, Mapping>,
    functions: Table<(i32, i32), Function>,
    locations: Table<(i32, i32, i64), Location>,
    stacks: Table<Vec<i32>, Stack>,
    attributes: Table<(i32, Val), KeyValueAndUnit>,
}

impl Dict {
    fn new() -> Dict {
        Dict {
            strings: Table::new(),
            mappings: Table::new(),
            functions: Table::new(),
            locations: Table::new(),
            stacks: Table::new(),
            attributes: Table::new(),
        }
    }

    fn string(&mut self, s: &str) -> i32 {
        if s.is_empty() {
            return 0;
        }
        self.strings.index(s.to_string(), || s.to_string())
    }

    fn attribute(&mut self, key: &str, v: Val) -> i32 {
        let k = self.string(key);
        let value = match &v {
            Val::Str(s) => any_value::Value::StringValue(s.clone()),
            Val::Int(i) => any_value::Value::IntValue(*i),
        };
        self.attributes.index((k, v), || KeyValueAndUnit {
            key_strindex: k,
            value: Some(AnyValue { value: Some(value) }),
            unit_strindex: 0,
        })
    }

    fn mapping(&mut self, module: &str, build_id: Option<&String>) -> i32 {
        if let Some(&i) = self.mappings.at.get(module) {
            return i;
        }
        let filename_strindex = self.string(module);
        // Semantic conventions: the GNU build id, in hex.
        let attribute_indices = build_id
            .map(|b| vec![self.attribute("process.executable.build_id.gnu", Val::Str(b.clone()))])
            .unwrap_or_default();
        self.mappings.index(module.to_string(), || Mapping {
            filename_strindex,
            attribute_indices,
            ..Default::default()
        })
    }

    fn location(&mut self, f: &Frame, kernel: bool, build_ids: &HashMap<&str, &String>) -> i32 {
        let module = match (&f.module, kernel) {
            (Some(m), _) => m.as_str(),
            (None, true) => "[kernel.kallsyms]",
            (None, false) => "[unknown]",
        };
        let mapping_index = self.mapping(module, build_ids.get(module).copied());
        let (name, file) = (self.string(&f.func), f.file.as_deref().unwrap_or(""));
        let file = self.string(file);
        let function_index = self.functions.index((name, file), || Function {
            name_strindex: name,
            system_name_strindex: name,
            filename_strindex: file,
            start_line: 0,
        });
        let line = f.line.map_or(0, i64::from);
        // Frames are kept by function and line, not by address.
        self.locations
            .index((mapping_index, function_index, line), || Location {
                mapping_index,
                address: 0,
                lines: vec![Line {
                    function_index,
                    line,
                    column: 0,
                }],
                attribute_indices: Vec::new(),
            })
    }

    /// The process, executable, cgroup and container a stack was seen in.
    fn attributes_of(&mut self, s: &RecStack) -> Vec<i32> {
        let mut a = vec![self.attribute("process.executable.name", Val::Str(s.comm.clone()))];
        // A stack merged from several processes is no one process's.
        if s.pid != 0 && s.processes <= 1 {
            a.push(self.attribute("process.pid", Val::Int(i64::from(s.pid))));
        }
        // The semantic conventions' names for pprof's labels.
        for (k, v) in group_labels(s) {
            let key = match k {
                "cgroup" => "process.linux.cgroup",
                "container_id" => "container.id",
                _ => "k8s.pod.uid",
            };
            a.push(self.attribute(key, Val::Str(v)));
        }
        a
    }
}

/// 16 random bytes, never all zero (the schema's invalid id).
fn profile_id() -> Vec<u8> {
    let half =
        || std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now());
    let mut id: Vec<u8> = [half(), half() | 1]
        .iter()
        .flat_map(|h| h.to_le_bytes())
        .collect();
    id.truncate(16);
    id
}

/// The record's stacks summed over its reports: one profile per sample
/// type (OTLP's profiles carry one each), sharing one dictionary.
pub fn profiles(rec: &Recording) -> ProfilesData {
    let (stacks, types) = stacks_and_types(rec);
    let mut d = Dict::new();
    let build_ids: HashMap<&str, &String> =
        rec.build_ids.iter().map(|(m, b)| (m.as_str(), b)).collect();
    // Samples by stack and attributes, each once: the intervals of a run
    // add up.
    let mut rows: Vec<(i32, Vec<i32>, Vec<i64>)> = Vec::new();
    let mut at: HashMap<(i32, Vec<i32>), usize> = HashMap::new();
    for s in &stacks {
        // Leaf first: the kernel's frames, then the user's.
        let kernel = s.kernel.iter().map(|f| (f, true));
        let locations: Vec<i32> = kernel
            .chain(s.user.iter().map(|f| (f, false)))
            .map(|(f, k)| d.location(f, k, &build_ids))
            .collect();
        let stack_index = d.stacks.index(locations.clone(), || Stack {
            location_indices: locations,
        });
        let attrs = d.attributes_of(s);
        let v = values(s, types.len());
        match at.get(&(stack_index, attrs.clone())) {
            Some(&i) => {
                for (sum, x) in rows[i].2.iter_mut().zip(v) {
                    *sum = sum.saturating_add(x);
                }
            }
            None => {
                at.insert((stack_index, attrs.clone()), rows.len());
                rows.push((stack_index, attrs, v));
            }
        }
    }
    let start = (rec.header.start * 1e9) as u64;
    let duration = rec.trailer.as_ref().map_or(0.0, |t| t.duration_s);
    let comment = d.attribute(
        "memtrace.command_line",
        Val::Str(format!("memtrace {}", rec.header.args.join(" "))),
    );
    let profiles = types
        .iter()
        .enumerate()
        .map(|(i, (ty, unit))| Profile {
            sample_type: Some(ValueType {
                type_strindex: d.string(ty),
                unit_strindex: d.string(unit),
            }),
            samples: rows
                .iter()
                .map(|(stack_index, attrs, v)| Sample {
                    stack_index: *stack_index,
                    attribute_indices: attrs.clone(),
                    values: vec![v[i]],
                    ..Default::default()
                })
                .collect(),
            time_unix_nano: start,
            duration_nano: (duration * 1e9) as u64,
            profile_id: profile_id(),
            attribute_indices: vec![comment],
            ..Default::default()
        })
        .collect();
    let host = |k: &str, v: String| KeyValue {
        key: k.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v)),
        }),
        key_strindex: 0,
    };
    ProfilesData {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![host("host.name", rec.header.host.clone())],
                dropped_attributes_count: 0,
            }),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "memtrace".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    attributes: Vec::new(),
                    dropped_attributes_count: 0,
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(ProfilesDictionary {
            mapping_table: d.mappings.items,
            location_table: d.locations.items,
            function_table: d.functions.items,
            link_table: vec![Link::default()],
            string_table: d.strings.items,
            attribute_table: d.attributes.items,
            stack_table: d.stacks.items,
        }),
    }
}

/// Writes `p` to `path` (gzip'd when it ends in `.gz`), whole or not at all.
pub fn write(p: &ProfilesData, path: &Path) -> Result<()> {
    let raw = p.encode_to_vec();
    let bytes = if path.extension().is_some_and(|e| e == "gz") {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&raw).and_then(|()| gz.finish())
    } else {
        Ok(raw)
    };
    bytes
        .and_then(|b| std::fs::write(path, b))
        .map_err(|e| super::write_error(path, e))
}
