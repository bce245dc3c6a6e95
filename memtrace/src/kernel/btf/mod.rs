//! Kernel struct offsets from BTF. Rust BPF code has no CO-RE relocations,
//! so userspace resolves offsets here and passes them to the programs.

use crate::error::Error;

pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

// BTF kinds (include/uapi/linux/btf.h).
const INT: u32 = 1;
const ARRAY: u32 = 3;
const STRUCT: u32 = 4;
const UNION: u32 = 5;
const ENUM: u32 = 6;
const TYPEDEF: u32 = 8;
const VOLATILE: u32 = 9;
const CONST: u32 = 10;
const RESTRICT: u32 = 11;
const FUNC: u32 = 12;
const FUNC_PROTO: u32 = 13;
const VAR: u32 = 14;
const DATASEC: u32 = 15;
const DECL_TAG: u32 = 17;
const TYPE_TAG: u32 = 18;
const ENUM64: u32 = 19;

/// A minimal reader of kernel BTF: one pass indexes where each type starts
/// and which types have names; member offsets are read on demand. A full
/// parser (btf-rs) took about 200 ms and 60 MiB for the few offsets memtrace
/// needs; this takes a few ms and keeps only the raw blob and an index.
pub struct KernelBtf {
    data: Blob,
    strs: usize,
    str_len: usize,
    /// Byte offset of type id i (index 0 is void).
    types: Vec<u32>,
    /// (hash of the name, id) of the named structs, unions and enums (the
    /// kinds looked up by name often; functions and typedefs are scanned),
    /// sorted: no string is copied (a map of owned names took 3 ms to build).
    names: Vec<(u64, u32)>,
}

/// The BTF bytes: mapped where the kernel allows it (6.16 and later), which
/// spares copying and faulting in megabytes at every start; read otherwise.
enum Blob {
    Owned(Vec<u8>),
    Mapped(*const u8, usize),
}

// SAFETY: the mapping is read-only and lives as long as the Blob.
unsafe impl Send for Blob {}
unsafe impl Sync for Blob {}

impl Blob {
    fn map(f: &std::fs::File) -> Option<Blob> {
        use std::os::fd::AsRawFd;
        let len = f.metadata().ok()?.len() as usize;
        if len == 0 {
            return None;
        }
        // SAFETY: a fresh read-only private mapping of an open file.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        };
        (p != libc::MAP_FAILED).then_some(Blob::Mapped(p as *const u8, len))
    }
}

impl std::ops::Deref for Blob {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Blob::Owned(v) => v,
            // SAFETY: mapped with this length in `map`, unmapped only in drop.
            Blob::Mapped(p, n) => unsafe { std::slice::from_raw_parts(*p, *n) },
        }
    }
}

impl Drop for Blob {
    fn drop(&mut self) {
        if let Blob::Mapped(p, n) = *self {
            // SAFETY: the mapping made in `map`; nothing borrows it any more.
            unsafe { libc::munmap(p as *mut libc::c_void, n) };
        }
    }
}

/// Bytes of a name that are hashed: names are compared in full after their
/// hashes match, and a bounded prefix keeps indexing linear when hostile BTF
/// has no NUL in its strings (each name would run to the section's end).
const HASHED: usize = 64;

/// FNV-1a of the first `HASHED` bytes of a name, up to its NUL.
fn name_hash(s: &[u8]) -> u64 {
    s.iter()
        .take(HASHED)
        .take_while(|&&b| b != 0)
        .fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

fn u32_at(d: &[u8], off: usize) -> Option<u32> {
    d.get(off..off + 4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
}

impl KernelBtf {
    /// The running kernel's BTF, read once per process.
    pub fn shared() -> Result<&'static KernelBtf, Error> {
        static BTF: std::sync::OnceLock<KernelBtf> = std::sync::OnceLock::new();
        if let Some(b) = BTF.get() {
            return Ok(b);
        }
        let b = Self::load()?;
        Ok(BTF.get_or_init(|| b))
    }

    pub fn load() -> Result<Self, Error> {
        let err = |e: std::io::Error| Error::NoBtf(format!("{VMLINUX}: {e}"));
        let f = std::fs::File::open(VMLINUX).map_err(err)?;
        match Blob::map(&f) {
            Some(b) => Self::parse(b),
            None => Self::from_vec(std::fs::read(VMLINUX).map_err(err)?),
        }
    }

    pub fn from_vec(d: Vec<u8>) -> Result<Self, Error> {
        Self::parse(Blob::Owned(d))
    }

    fn parse(d: Blob) -> Result<Self, Error> {
        let bad = |what: &str| Error::NoBtf(format!("malformed BTF: {what}"));
        if d.len() < 24 || u16::from_le_bytes([d[0], d[1]]) != 0xeb9f {
            return Err(bad("no BTF magic (only little-endian BTF is read)"));
        }
        let hdr = u32_at(&d, 4).ok_or_else(|| bad("header"))? as usize;
        let type_off = u32_at(&d, 8).ok_or_else(|| bad("header"))? as usize + hdr;
        let type_len = u32_at(&d, 12).ok_or_else(|| bad("header"))? as usize;
        let strs = u32_at(&d, 16).ok_or_else(|| bad("header"))? as usize + hdr;
        let str_len = u32_at(&d, 20).ok_or_else(|| bad("header"))? as usize;
        if type_off + type_len > d.len() || strs + str_len > d.len() {
            return Err(bad("sections out of bounds"));
        }
        let mut types = vec![0u32];
        let mut named: Vec<(u32, u32)> = Vec::new();
        let mut off = type_off;
        let end = type_off + type_len;
        while off + 12 <= end {
            let id = types.len() as u32;
            types.push(off as u32);
            let name_off = u32_at(&d, off).unwrap();
            let info = u32_at(&d, off + 4).unwrap();
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            if name_off != 0 && matches!(kind, STRUCT | UNION | ENUM) {
                named.push((name_off, id));
            }
            off += 12
                + match kind {
                    INT | VAR | DECL_TAG => 4,
                    ARRAY => 12,
                    STRUCT | UNION | DATASEC | ENUM64 => 12 * vlen,
                    ENUM | FUNC_PROTO => 8 * vlen,
                    _ => 0,
                };
        }
        let mut btf = KernelBtf {
            data: d,
            strs,
            str_len,
            types,
            names: Vec::with_capacity(named.len()),
        };
        btf.names = named
            .into_iter()
            .map(|(off, id)| (name_hash(btf.str_bytes(off)), id))
            .collect();
        btf.names.sort_unstable();
        Ok(btf)
    }

    /// Whether the string at `off` is `name`, compared in place (no UTF-8
    /// check: scans compare every type's name).
    fn name_is(&self, off: u32, name: &str) -> bool {
        let start = self.strs + off as usize;
        let end = start + name.len();
        end < self.strs + self.str_len
            && &self.data[start..end] == name.as_bytes()
            && self.data[end] == 0
    }

    /// The string section from `off` on (empty past its end).
    fn str_bytes(&self, off: u32) -> &[u8] {
        let end = self.strs + self.str_len;
        &self.data[(self.strs + off as usize).min(end)..end]
    }

    /// (kind, vlen, size_or_type) of type `id`.
    fn head(&self, id: u32) -> Option<(u32, usize, u32)> {
        let off = *self.types.get(id as usize)? as usize;
        if id == 0 {
            return None;
        }
        let info = u32_at(&self.data, off + 4)?;
        Some((
            (info >> 24) & 0x1f,
            (info & 0xffff) as usize,
            u32_at(&self.data, off + 8)?,
        ))
    }

    /// The id of the type of `kind` called `name`, by a scan of every type.
    fn scan(&self, name: &str, kind: u32) -> Option<u32> {
        (1..self.types.len() as u32).find(|&id| {
            let off = self.types[id as usize] as usize;
            let info = u32_at(&self.data, off + 4).unwrap_or(0);
            (info >> 24) & 0x1f == kind && self.name_is(u32_at(&self.data, off).unwrap_or(0), name)
        })
    }

    /// Ids of the structs, unions and enums called `name`.
    fn ids<'a>(&'a self, name: &'a str) -> impl Iterator<Item = u32> + 'a {
        let h = name_hash(name.as_bytes());
        let from = self.names.partition_point(|&(k, _)| k < h);
        self.names[from..]
            .iter()
            .take_while(move |&&(k, _)| k == h)
            .map(|&(_, id)| id)
            .filter(move |&id| {
                let off = self.types[id as usize] as usize;
                self.name_is(u32_at(&self.data, off).unwrap_or(0), name)
            })
    }

    fn named_struct(&self, name: &str) -> Option<u32> {
        self.ids(name)
            .find(|&id| matches!(self.head(id), Some((STRUCT | UNION, vlen, _)) if vlen > 0))
    }

    /// Follows typedefs and qualifiers to the underlying type.
    fn resolve(&self, mut id: u32) -> Option<u32> {
        for _ in 0..32 {
            match self.head(id)? {
                (TYPEDEF | VOLATILE | CONST | RESTRICT | TYPE_TAG, _, t) => id = t,
                _ => return Some(id),
            }
        }
        None
    }

    /// Byte offset of `member` in `struct name`, looking through anonymous
    /// structs and unions.
    pub fn offset(&self, name: &str, member: &str) -> Option<u32> {
        let id = self.named_struct(name)?;
        self.find_member(id, member).map(|bits| bits / 8)
    }

    fn find_member(&self, id: u32, member: &str) -> Option<u32> {
        self.find(id, member).map(|(bits, _)| bits)
    }

    /// Bit offset and type id of `member`, looking through anonymous members.
    fn find(&self, id: u32, member: &str) -> Option<(u32, u32)> {
        self.find_in(id, member, 0, &mut Walk::default())
    }

    /// `find`, each struct or union searched at most once: hostile BTF whose
    /// anonymous members point back at their struct made the search
    /// exponential (vlen^depth; 13 s for a 41 KB fuzz input). Valid C cannot
    /// hold the same anonymous type twice where one search reaches it (its
    /// members would clash), so a type already searched has nothing to add.
    fn find_in(&self, id: u32, member: &str, depth: usize, w: &mut Walk) -> Option<(u32, u32)> {
        let (kind, vlen, _) = self.head(id)?;
        if !matches!(kind, STRUCT | UNION) || depth > 8 || !w.seen.insert(id) {
            return None;
        }
        let kind_flag = u32_at(&self.data, self.types[id as usize] as usize + 4)? >> 31;
        let base = self.types[id as usize] as usize + 12;
        for i in 0..vlen {
            w.members += 1;
            let m = base + 12 * i;
            let name_off = u32_at(&self.data, m)?;
            let ty = u32_at(&self.data, m + 4)?;
            let raw = u32_at(&self.data, m + 8)?;
            let bits = if kind_flag == 1 { raw & 0xffffff } else { raw };
            if name_off != 0 {
                if self.name_is(name_off, member) {
                    return Some((bits, ty));
                }
            } else if let Some(inner) = self.resolve(ty) {
                if let Some((off, t)) = self.find_in(inner, member, depth + 1, w) {
                    return Some((bits + off, t));
                }
            }
        }
        None
    }

    /// (stride, offset of the count) of the RSS counters in `mm->rss_stat`:
    /// an array of `struct percpu_counter` since 6.2, before it a
    /// `struct mm_rss_stat` holding `atomic_long_t count[]`.
    pub(super) fn rss_layout(&self) -> Option<(u32, u32)> {
        let mm = self.named_struct("mm_struct")?;
        let (_, ty) = self.find(mm, "rss_stat")?;
        let ty = self.resolve(ty)?;
        match self.head(ty)? {
            (ARRAY, _, _) => Some((
                self.size("percpu_counter")?,
                self.offset("percpu_counter", "count")?,
            )),
            (STRUCT, _, _) => Some((8, self.find_member(ty, "count")? / 8)),
            _ => None,
        }
    }

    pub fn size(&self, name: &str) -> Option<u32> {
        self.named_struct(name)
            .and_then(|id| self.head(id))
            .map(|(_, _, size)| size)
    }

    /// Value of enumerator `name` in the enum `enum_name`, or in any enum
    /// when `enum_name` is empty: many kernel enums have no name
    /// (`enum { MM_FILEPAGES, ... }`), and C enumerators share one scope, so
    /// the name alone is unique.
    pub fn enumerator(&self, enum_name: &str, name: &str) -> Option<u32> {
        let all: Box<dyn Iterator<Item = u32>> = if enum_name.is_empty() {
            Box::new(1..self.types.len() as u32)
        } else {
            Box::new(self.ids(enum_name))
        };
        for id in all {
            let Some((ENUM, vlen, _)) = self.head(id) else {
                continue;
            };
            let base = self.types[id as usize] as usize + 12;
            for i in 0..vlen {
                let m = base + 8 * i;
                if self.name_is(u32_at(&self.data, m)?, name) {
                    return u32_at(&self.data, m + 4);
                }
            }
        }
        None
    }

    /// Whether the kernel has a function `name` (a kprobe/fentry target).
    pub fn has_func(&self, name: &str) -> bool {
        self.func_id(name).is_some()
    }

    /// The BTF id of function `name`: what an fentry program attaches to.
    pub fn func_id(&self, name: &str) -> Option<u32> {
        self.scan(name, FUNC)
    }

    /// Whether tp_btf can attach to tracepoint `name` (its `btf_trace_` typedef exists).
    pub fn has_btf_tracepoint(&self, name: &str) -> bool {
        self.scan(&format!("btf_trace_{name}"), TYPEDEF).is_some()
    }
}

/// One member search: the structs already searched, and how many members
/// were read (what the tests bound).
#[derive(Default)]
struct Walk {
    seen: std::collections::HashSet<u32>,
    members: usize,
}

pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as u64
    } else {
        4096
    }
}

#[cfg(test)]
mod tests;
