//! /proc/PID/maps: a process's mappings, with their paths interned.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

#[derive(Debug, Clone, PartialEq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub perms: Perms,
    pub dev: (u32, u32),
    pub inode: u64,
    /// For display: bytes that are not UTF-8 shown as U+FFFD.
    pub path: Arc<str>,
    /// The path as the kernel gave it, byte for byte, to open the file by.
    pub file: Arc<Path>,
}

/// A mapping's permissions as maps writes them (`r-xp`), inline.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Perms([u8; 4]);

impl Perms {
    pub fn contains(&self, c: char) -> bool {
        self.0.contains(&(c as u8))
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or("????")
    }
}

impl From<&str> for Perms {
    fn from(s: &str) -> Perms {
        let mut p = *b"----";
        for (d, b) in p.iter_mut().zip(s.bytes()) {
            *d = b;
        }
        Perms(p)
    }
}

impl std::fmt::Debug for Perms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A path as shown (lossy UTF-8) and as opened (the kernel's bytes).
type Names = (Arc<str>, Arc<Path>);

/// Paths interned: every process maps libc and the loader, and memtrace
/// keeps the maps of thousands of processes (those that exited, for their
/// stacks). Each path is one allocation shared by every mapping of it, not
/// two per mapping (a Python process has a hundred mappings).
struct Interned {
    paths: HashMap<Box<[u8]>, Names>,
    /// Size at which the paths no mapping holds any more are let go.
    sweep_at: usize,
}

/// Paths kept before the first sweep (and the least a sweep leaves room
/// for).
const INTERNED: usize = 4096;

fn intern(bytes: &[u8]) -> Names {
    use std::os::unix::ffi::OsStrExt;
    static PATHS: OnceLock<Mutex<Interned>> = OnceLock::new();
    let make = || {
        (
            Arc::from(String::from_utf8_lossy(bytes).as_ref()),
            Arc::from(Path::new(std::ffi::OsStr::from_bytes(bytes))),
        )
    };
    let Ok(mut t) = PATHS
        .get_or_init(|| {
            Mutex::new(Interned {
                paths: HashMap::new(),
                sweep_at: INTERNED,
            })
        })
        .lock()
    else {
        return make();
    };
    if let Some((s, p)) = t.paths.get(bytes) {
        return (s.clone(), p.clone());
    }
    if t.paths.len() >= t.sweep_at {
        t.paths.retain(|_, (s, _)| Arc::strong_count(s) > 1);
        t.sweep_at = (t.paths.len() * 2).max(INTERNED);
    }
    let v = make();
    t.paths.insert(bytes.into(), v.clone());
    v
}

/// Parses /proc/PID/maps text.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    parse_maps_bytes(text.as_bytes())
}

/// Parses /proc/PID/maps as bytes: paths are bytes, and one that is not
/// UTF-8 must not cost the process its other mappings.
pub fn parse_maps_bytes(text: &[u8]) -> Vec<Mapping> {
    let mut out = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        // Five fields, then the path (which may hold spaces) after the
        // padding.
        let mut rest = line;
        let mut fields = [""; 5];
        let mut ok = true;
        for f in fields.iter_mut() {
            let start = rest.iter().position(|&b| b != b' ').unwrap_or(rest.len());
            rest = &rest[start..];
            let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
            match std::str::from_utf8(&rest[..end]) {
                Ok(v) if !v.is_empty() => *f = v,
                _ => ok = false,
            }
            rest = &rest[end..];
        }
        if !ok {
            continue;
        }
        let path = &rest[rest.iter().position(|&b| b != b' ').unwrap_or(rest.len())..];
        // The kernel writes a newline in a path as `\012` (the line's end
        // is a newline): the file is opened by its real name.
        let path = unescape_newlines(path);
        let [range, perms, off, dev, ino] = fields;
        let Some((s, e)) = range.split_once('-') else {
            continue;
        };
        let (Some((maj, min)), Ok(start), Ok(end), Ok(offset), Ok(inode)) = (
            dev.split_once(':'),
            u64::from_str_radix(s, 16),
            u64::from_str_radix(e, 16),
            u64::from_str_radix(off, 16),
            ino.parse::<u64>(),
        ) else {
            continue;
        };
        let (path, file) = intern(&path);
        out.push(Mapping {
            start,
            end,
            offset,
            perms: perms.into(),
            dev: (
                u32::from_str_radix(maj, 16).unwrap_or(0),
                u32::from_str_radix(min, 16).unwrap_or(0),
            ),
            inode,
            path,
            file,
        });
    }
    out
}

/// A maps path with the kernel's `\012` (its escape for a newline, the
/// only byte it escapes there) turned back into the byte.
fn unescape_newlines(path: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    const ESC: &[u8] = b"\\012";
    if !path.windows(ESC.len()).any(|w| w == ESC) {
        return std::borrow::Cow::Borrowed(path);
    }
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        if path[i..].starts_with(ESC) {
            out.push(b'\n');
            i += ESC.len();
        } else {
            out.push(path[i]);
            i += 1;
        }
    }
    std::borrow::Cow::Owned(out)
}

pub fn read_maps(pid: u32) -> Option<Vec<Mapping>> {
    std::fs::read(format!("/proc/{pid}/maps"))
        .ok()
        .map(|t| parse_maps_bytes(&t))
}

impl Mapping {
    /// The mapped file itself, by the kernel's link to this mapping
    /// (`/proc/PID/map_files`): no path of the process's is resolved, so a
    /// symlink it planted (in a container's tree) cannot send root to
    /// another file. Valid while the mapping is.
    pub fn file_in(&self, pid: u32) -> PathBuf {
        format!("/proc/{pid}/map_files/{:x}-{:x}", self.start, self.end).into()
    }

    /// The mapped file opened for reading: found by `file_in`, or where
    /// that link is refused (no CAP_SYS_ADMIN, the process gone) by its
    /// path inside the process's root (no symlink leaving it), else in
    /// memtrace's. Found first without opening it (O_PATH: no driver's
    /// open runs), and opened only if it is a regular file and the very
    /// file the mapping names (device and inode).
    pub fn open_in(&self, pid: u32) -> std::io::Result<File> {
        use rustix::fs::{Mode, OFlags};
        let found = self.locate(pid)?;
        let st = rustix::fs::fstat(&found)?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(std::io::Error::other("not a regular file"));
        }
        let dev = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
        if (dev, st.st_ino) != (self.dev, self.inode) {
            return Err(std::io::Error::other("not the file it maps"));
        }
        let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(fd_path(&found), flags, Mode::empty())?;
        Ok(fd.into())
    }

    fn locate(&self, pid: u32) -> std::io::Result<std::os::fd::OwnedFd> {
        use rustix::fs::{Mode, OFlags, ResolveFlags};
        let path = OFlags::PATH | OFlags::CLOEXEC;
        if let Ok(f) = rustix::fs::open(self.file_in(pid), path, Mode::empty()) {
            return Ok(f);
        }
        let in_root = rustix::fs::open(
            format!("/proc/{pid}/root"),
            path | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .and_then(|root| {
            let r = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS;
            rustix::fs::openat2(&root, &*self.file, path, Mode::empty(), r)
        });
        Ok(in_root.or_else(|_| rustix::fs::open(&*self.file, path, Mode::empty()))?)
    }
}

/// The path of one of this process's descriptors (`/proc/self/fd/N`): the
/// kernel resolves it to that very file.
pub fn fd_path(fd: &impl std::os::fd::AsRawFd) -> PathBuf {
    format!("/proc/self/fd/{}", fd.as_raw_fd()).into()
}

/// `f` kept open for the rest of the run, by its path: for what the kernel
/// is handed by path (a uprobe's file), which then names the file memtrace
/// read and checked, not whatever is at the process's path by then. One
/// descriptor a file.
pub fn pinned(f: File) -> std::io::Result<PathBuf> {
    static PINNED: OnceLock<Mutex<HashMap<(u64, u64), File>>> = OnceLock::new();
    let st = rustix::fs::fstat(&f)?;
    let mut m = PINNED
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| std::io::Error::other("poisoned"))?;
    let kept = m.entry((st.st_dev, st.st_ino)).or_insert(f);
    Ok(fd_path(kept))
}

/// Object files read whole (symbols, relocations) stop at this size: a
/// process could map a file of any size.
pub const MAX_OBJECT: u64 = 2 << 30;

fn regular(f: &File) -> std::io::Result<u64> {
    let st = rustix::fs::fstat(f)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(st.st_size as u64)
}

/// The whole of an object file at `path` (one of `file_in`'s links, or a
/// path of memtrace's own): a regular file of at most `MAX_OBJECT` bytes.
pub fn read_object(path: &Path) -> std::io::Result<Vec<u8>> {
    read_file(File::open(path)?)
}

/// The whole of an opened object file, bounded as `read_object`: read at
/// offsets (a handle shared with others keeps its position).
pub fn read_file(f: File) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let size = regular(&f)?;
    if size > MAX_OBJECT {
        return Err(std::io::Error::other(format!(
            "{size} bytes, more than memtrace reads of one object"
        )));
    }
    let mut out = vec![0u8; size as usize];
    let mut at = 0;
    while at < out.len() {
        match f.read_at(&mut out[at..], at as u64)? {
            0 => break,
            n => at += n,
        }
    }
    out.truncate(at);
    Ok(out)
}
