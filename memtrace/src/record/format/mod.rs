//! The record file: a CBOR sequence (RFC 8742) of self-describing items,
//! a header, one item per report the tool printed, and a trailer. Each item
//! is written whole and flushed, so a file cut short (memtrace killed, disk
//! full) reads up to its last complete item. From version 2 every item
//! after the header is framed with its CRC-32 (`frame`): damage in the
//! middle is an error, not a cut.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::budget;
use super::frame::Next;
use crate::error::{Error, Result};
use crate::output::frame::FrameStyle;
use crate::output::frame::{fingerprint, Frame};
use crate::output::{AllocFigures, StackReport};

/// What the header's `magic` says.
pub const MAGIC: &str = "memtrace-record";
/// Bumped when a reader of the previous version could misread the file
/// (3: the items compressed, `stream`).
pub const VERSION: u32 = 3;
/// CBOR's "self-described CBOR" tag (55799), first in the file: `file(1)`
/// and CBOR tools see what it is; memtrace checks it before anything else.
const SELF_DESCRIBED: [u8; 3] = [0xd9, 0xd9, 0xf7];

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Header {
    pub magic: String,
    pub version: u32,
    pub memtrace: String,
    pub tool: String,
    /// The command line after `memtrace`.
    #[serde(deserialize_with = "budget::list")]
    pub args: Vec<String>,
    pub kernel: String,
    pub host: String,
    /// Seconds since the epoch.
    pub start: f64,
    /// How the live tool printed frames: function, lines or addresses.
    pub style: String,
    pub per_pid: bool,
}

/// One stack with its figures, frames innermost first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stack {
    pub pid: u32,
    pub comm: String,
    pub count: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    #[serde(deserialize_with = "budget::list")]
    pub user: Vec<Frame>,
    #[serde(deserialize_with = "budget::list")]
    pub kernel: Vec<Frame>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub processes: u32,
    /// memleak: allocs, bytes, frees, freed bytes, and flags (churn,
    /// estimated, by_bytes) as bits 0..2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc: Option<[u64; 5]>,
    /// The process's memory cgroup path, where known (older records lack
    /// it; a reader of them skips it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
}

/// One report the live tool printed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub seq: u64,
    /// Seconds since the start of the run.
    pub at: f64,
    pub kind: String,
    pub title: String,
    #[serde(deserialize_with = "budget::list")]
    pub stacks: Vec<Stack>,
    /// Build ids (hex) of the modules first named in this item.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "budget::map"
    )]
    pub build_ids: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Trailer {
    pub reports: u64,
    pub duration_s: f64,
    pub events: u64,
    #[serde(deserialize_with = "budget::list")]
    pub lost: Vec<(String, u64)>,
    #[serde(default)]
    pub command_status: Option<i32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Item {
    Header(Header),
    Report(Report),
    Table(super::table::Table),
    Trailer(Trailer),
}

impl Stack {
    pub fn from_report(s: &StackReport) -> Stack {
        Stack {
            pid: s.pid,
            comm: s.comm.clone(),
            count: s.count,
            bytes: s.bytes,
            user: s.user.iter().map(|f| Frame::parse(f)).collect(),
            kernel: s.kernel.iter().map(|f| Frame::parse(f)).collect(),
            note: s.note.clone(),
            processes: s.processes as u32,
            alloc: s.alloc.map(|a| {
                let flags = a.churn as u64 | (a.estimated as u64) << 1 | (a.by_bytes as u64) << 2;
                [a.allocs, a.bytes, a.frees, a.freed_bytes, flags]
            }),
            cgroup: s.group.clone(),
        }
    }

    /// The stack as the live tools hand it to a printer.
    pub fn to_report(&self, style: FrameStyle) -> StackReport {
        StackReport {
            pid: self.pid,
            comm: self.comm.clone(),
            count: self.count,
            bytes: self.bytes,
            user: self.user.iter().map(|f| f.render(style).into()).collect(),
            kernel: self.kernel.iter().map(|f| f.render(style).into()).collect(),
            note: self.note.clone(),
            processes: self.processes as usize,
            pids: Vec::new(),
            alloc: self
                .alloc
                .map(|[allocs, bytes, frees, freed_bytes, fl]| AllocFigures {
                    allocs,
                    bytes,
                    frees,
                    freed_bytes,
                    churn: fl & 1 != 0,
                    estimated: fl & 2 != 0,
                    by_bytes: fl & 4 != 0,
                }),
            group: self.cgroup.clone(),
        }
    }

    pub fn id(&self) -> String {
        fingerprint(&self.kernel, &self.user)
    }
}

pub fn style_name(s: FrameStyle) -> &'static str {
    match s {
        FrameStyle::Function => "function",
        FrameStyle::Lines => "lines",
        FrameStyle::Addresses => "addresses",
    }
}

pub fn style_of(name: &str) -> FrameStyle {
    match name {
        "lines" => FrameStyle::Lines,
        "addresses" => FrameStyle::Addresses,
        _ => FrameStyle::Function,
    }
}

/// Writes the file's first bytes and its header.
pub fn write_start(w: &mut dyn Write, h: Header) -> std::io::Result<()> {
    let mut buf = SELF_DESCRIBED.to_vec();
    encode(&Item::Header(h), &mut buf)?;
    w.write_all(&buf)?;
    w.flush()
}

/// One item, framed with its checksum, written with one write and flushed.
pub fn write_item(w: &mut dyn Write, item: &Item) -> std::io::Result<()> {
    let mut buf = Vec::new();
    encode(item, &mut buf)?;
    w.write_all(&super::frame::framed(&buf))?;
    w.flush()
}

fn encode(item: &Item, buf: &mut Vec<u8>) -> std::io::Result<()> {
    ciborium::into_writer(item, buf).map_err(|e| std::io::Error::other(e.to_string()))
}

/// The tag of an item, read past everything else without keeping it.
#[derive(Deserialize)]
struct Tag {
    #[serde(rename = "type")]
    kind: String,
}

/// An item decoded by its tag, in two passes: serde's tagged enums first
/// copy the whole item into a generic tree, many times its size, before
/// the budget sees an element of it.
fn typed(bytes: &[u8]) -> std::result::Result<Item, Unreadable> {
    fn de<T: serde::de::DeserializeOwned>(b: &[u8]) -> std::result::Result<T, Unreadable> {
        ciborium::from_reader(budget::Counted(b)).map_err(Unreadable::from)
    }
    let tag: Tag = ciborium::from_reader(bytes)?;
    match tag.kind.as_str() {
        "report" => de(bytes).map(Item::Report),
        "table" => de(bytes).map(Item::Table),
        "trailer" => de(bytes).map(Item::Trailer),
        "header" => de(bytes).map(Item::Header),
        other => Err(Unreadable::Kind(other.to_string())),
    }
}

/// Why an item of a record file could not be read.
#[derive(Debug, thiserror::Error)]
enum Unreadable {
    /// What serde said (a missing field, the budget's refusal).
    #[error("{0}")]
    Semantic(String),
    #[error("{0:?}")]
    Cbor(ciborium::de::Error<std::io::Error>),
    #[error("an item of unknown type {0:?}")]
    Kind(String),
}

impl From<ciborium::de::Error<std::io::Error>> for Unreadable {
    fn from(e: ciborium::de::Error<std::io::Error>) -> Self {
        match e {
            ciborium::de::Error::Semantic(_, m) => Unreadable::Semantic(m),
            e => Unreadable::Cbor(e),
        }
    }
}

/// A record file read back.
#[derive(Debug, Clone)]
pub struct Recording {
    pub header: Header,
    pub reports: Vec<Report>,
    /// Tables the live tool printed (replayed in order with the reports).
    pub tables: Vec<super::table::Table>,
    pub trailer: Option<Trailer>,
    /// Module name -> build id, from every item.
    pub build_ids: BTreeMap<String, String>,
}

impl Recording {
    /// Reads `path`; a one-line usage error (exit 2) when it is missing or
    /// not a memtrace record.
    pub fn open(path: &Path) -> Result<Recording> {
        let f = std::fs::File::open(path)
            .map_err(|e| Error::Usage(format!("cannot open {}: {e}", path.display())))?;
        Self::read(BufReader::new(f), &path.display().to_string())
    }

    pub fn read(mut r: impl BufRead, name: &str) -> Result<Recording> {
        budget::start();
        let not_ours = || Error::Usage(format!("{name} is not a memtrace record file"));
        let mut magic = [0u8; 3];
        r.read_exact(&mut magic).map_err(|_| not_ours())?;
        if magic != SELF_DESCRIBED {
            return Err(not_ours());
        }
        let header = match ciborium::from_reader::<Item, _>(budget::Counted(&mut r)) {
            Ok(Item::Header(h)) if h.magic == MAGIC => h,
            _ => return Err(not_ours()),
        };
        if header.version > VERSION {
            return Err(Error::Usage(format!(
                "{name} is a version {} record; this memtrace reads up to version {VERSION}",
                header.version
            )));
        }
        let mut rec = Recording {
            header,
            reports: Vec::new(),
            tables: Vec::new(),
            trailer: None,
            build_ids: BTreeMap::new(),
        };
        if rec.header.version >= 3 {
            let mut body = BufReader::new(super::stream::Inflated::new(r));
            let read = rec.items(&mut body, name);
            if let Some(what) = body.get_ref().damage.clone() {
                return Err(Error::Runtime(format!(
                    "{name}: the compressed items are damaged ({what})"
                )));
            }
            read?;
        } else {
            rec.items(&mut r, name)?;
        }
        Ok(rec)
    }

    /// The items after the header, to the trailer or the file's end.
    fn items(&mut self, r: &mut dyn BufRead, name: &str) -> Result<()> {
        let rec = self;
        let damaged = |what: String| Error::Runtime(format!("{name}: {what}"));
        // Past the 3 magic bytes and the header.
        let mut at = 0u64;
        loop {
            let item = if rec.header.version >= 2 {
                match super::frame::next(&mut &mut *r, &mut at) {
                    Next::End | Next::Cut => break,
                    Next::Damaged(what) => return Err(damaged(what)),
                    Next::Item(bytes) => match typed(&bytes) {
                        Ok(item) => item,
                        Err(e) => return Err(damaged(format!("an item is not readable: {e}"))),
                    },
                }
            } else {
                // Version 1: items unframed; a clean end between items, or
                // one cut short inside an item.
                if r.fill_buf().map(|b| b.is_empty()).unwrap_or(true) {
                    break;
                }
                match ciborium::from_reader::<Item, _>(budget::Counted(&mut *r)) {
                    Ok(item) => item,
                    Err(_) => break,
                }
            };
            match item {
                Item::Report(rep) => {
                    rec.build_ids.extend(rep.build_ids.clone());
                    rec.reports.push(rep);
                }
                Item::Table(t) => rec.tables.push(t),
                Item::Trailer(t) => {
                    rec.trailer = Some(t);
                    break;
                }
                Item::Header(_) => break,
            }
        }
        Ok(())
    }

    /// "truncated after N records" when the file has no trailer.
    pub fn warning(&self, name: &str) -> Option<String> {
        self.trailer.is_none().then(|| {
            format!(
                "{name}: truncated after {} records (the run was cut short)",
                self.reports.len() + self.tables.len()
            )
        })
    }

    pub fn style(&self) -> FrameStyle {
        style_of(&self.header.style)
    }
}

#[cfg(test)]
mod tests;
