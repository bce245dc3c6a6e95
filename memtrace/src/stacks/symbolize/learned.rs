//! Mappings the kernel programs saw made (`crate::probes::exemaps`), added to the
//! process model without /proc: a process that execs, maps its libraries
//! and exits before its maps could be read still has an image. Files are
//! found by device and inode among those held open (most libraries are
//! mapped by processes already read, memtrace included), else through the
//! process's /proc/PID/map_files while it lives, else by the path exec was
//! given; failing all, named by what the kernel told.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;

use memtrace_common::exemaps::ExeMap;

use super::{Mapping, MapsCache, Snapshot, GENERATIONS};
use crate::process::maps::read_maps;
use crate::process::proc::{exiting, split_dev};

/// The path an open file is known by now.
fn fd_path(f: &File) -> Option<String> {
    std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

/// File offset of `mm->start_code` in `f`: that of its lowest executable
/// segment (where the kernel takes start_code from).
fn code_offset(f: &File) -> Option<u64> {
    let cache = object::ReadCache::new(f);
    let obj = object::File::parse(&cache).ok()?;
    crate::stacks::unwind::exec_segments(&obj)
        .into_iter()
        .min_by_key(|&(_, _, vaddr)| vaddr)
        .map(|(off, _, _)| off)
}

fn page_up(n: u64) -> u64 {
    let p = crate::kernel::btf::page_size();
    n.div_ceil(p) * p
}

impl MapsCache {
    /// Opens the executable files memtrace itself maps (libc, ld.so): many
    /// processes share them, and a mapping learned of one that is gone
    /// finds its file here.
    pub fn hold_own_files(&mut self) {
        let me = std::process::id();
        if let Some(maps) = read_maps(me) {
            self.open_files(me, &maps);
            self.held.extend(maps.iter().map(|m| (m.dev, m.inode)));
        }
    }

    /// The open file the kernel named (`ev.dev`, `ev.ino`) and the path it
    /// is known by; `path`, if given, is tried when nothing else finds it.
    fn learned_file(&mut self, ev: &ExeMap, path: Option<PathBuf>) -> Option<(Arc<File>, String)> {
        let key = (split_dev(ev.dev), ev.ino);
        if let Some(f) = self.files.get(&key) {
            return Some((f.clone(), fd_path(f).unwrap_or_default()));
        }
        let end = ev.start + page_up(ev.len);
        let through = PathBuf::from(format!("/proc/{}/map_files/{:x}-{end:x}", ev.pid, ev.start));
        for p in std::iter::once(through).chain(path) {
            let Ok(f) = File::open(&p) else { continue };
            // Inode only: stat's st_dev is not always the superblock's.
            if !f.metadata().is_ok_and(|md| md.ino() == ev.ino) {
                continue;
            }
            let f = Arc::new(f);
            let shown = fd_path(&f).unwrap_or_else(|| p.to_string_lossy().into_owned());
            crate::stacks::buildid::saw(&shown, &f);
            self.files.insert(key, f.clone());
            return Some((f, shown));
        }
        None
    }

    /// A mapping as /proc would have shown it; `name` is what the kernel
    /// gave (a path or a file name), shown with the device and inode when
    /// no file was found.
    fn learned_mapping(&mut self, ev: &ExeMap, name: &[u8], image: bool) -> Mapping {
        let given = PathBuf::from(OsStr::from_bytes(name));
        let path = match (image, given.is_absolute(), name.is_empty()) {
            (true, true, _) => Some(given.clone()),
            (true, false, false) => {
                Some(PathBuf::from(format!("/proc/{}/cwd", ev.pid)).join(&given))
            }
            _ => None,
        };
        let found = self.learned_file(ev, path);
        let dev = split_dev(ev.dev);
        let (shown, file, offset) = match found {
            Some((f, shown)) => {
                let offset = if image {
                    code_offset(&f).unwrap_or(0)
                } else {
                    ev.pgoff
                };
                (shown.clone(), PathBuf::from(shown), offset)
            }
            None => {
                let id = format!("[dev {}:{} inode {}]", dev.0, dev.1, ev.ino);
                let shown = match name.is_empty() {
                    true => id,
                    false => format!("{} {id}", given.to_string_lossy()),
                };
                // No path to open: a file now there may not be the one mapped.
                (shown, PathBuf::new(), ev.pgoff)
            }
        };
        let end = if image {
            ev.start + ev.len
        } else {
            ev.start + page_up(ev.len)
        };
        Mapping {
            start: ev.start,
            end,
            offset,
            perms: "r-xp".into(),
            dev,
            inode: ev.ino,
            path: shown.into(),
            file: file.into(),
        }
    }

    /// `ev.pid` exec'd (a `PROC_IMAGE` record): its image now, read from
    /// /proc if it is still there, else the binary's code as the kernel
    /// saw it; the image it left kept aside.
    pub fn exec_learned(&mut self, ev: &ExeMap, name: &[u8]) {
        let pid = ev.pid;
        if let Some(kt) = self.ktables.as_mut() {
            kt.exec(pid);
        }
        let old = self.procs.get(&pid).map(|s| s.maps.clone());
        if !self.snapshot(pid) {
            let image = self.learned_mapping(ev, name, true);
            self.keep(pid);
            let earlier = self
                .procs
                .remove(&pid)
                .map(|s| s.earlier)
                .unwrap_or_default();
            // Gone: kept for symbolization only. A table pushed for it
            // would outlive it (the kernel dropped its own at the exit)
            // and hold rows the live processes need.
            let maps = Arc::new(vec![image]);
            self.procs.insert(pid, Snapshot { maps, earlier });
        }
        if let (Some(old), Some(s)) = (old, self.procs.get_mut(&pid)) {
            // Unless the image kept was the new one already (read at a
            // ptrace stop of this exec).
            let new_already = old
                .iter()
                .any(|m| m.inode == ev.ino && m.start <= ev.start && ev.start < m.end);
            if !new_already && *old != *s.maps {
                s.earlier.insert(0, old);
                s.earlier.truncate(GENERATIONS);
            }
        }
        let now = std::time::Instant::now();
        for ms in [30, 300] {
            self.pending
                .push((pid, now + std::time::Duration::from_millis(ms)));
        }
    }

    /// `ev.pid` mapped a file executable (a `PROC_MAP` record): the
    /// mapping joins its current image, replacing what it was mapped over.
    pub fn map_learned(&mut self, ev: &ExeMap, name: &[u8]) {
        let pid = ev.pid;
        let m = self.learned_mapping(ev, name, false);
        self.keep(pid);
        let snap = self.procs.entry(pid).or_insert_with(|| Snapshot {
            maps: Arc::new(Vec::new()),
            earlier: Vec::new(),
        });
        let same = |o: &Mapping| {
            (o.start, o.end, o.offset, o.inode) == (m.start, m.end, m.offset, m.inode)
        };
        if snap.maps.iter().any(same) {
            return;
        }
        let maps = Arc::make_mut(&mut snap.maps);
        maps.retain(|o| o.end <= m.start || o.start >= m.end);
        maps.push(m);
        maps.sort_by_key(|o| o.start);
        // Only a live process's table is pushed (see `exec_learned`).
        if let Some(kt) = self.ktables.as_mut().filter(|_| !exiting(pid)) {
            kt.update(pid, &snap.maps, &self.files);
        }
    }
}
