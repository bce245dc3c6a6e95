//! The guest's initramfs, one per architecture: a cpio "newc" archive
//! written here with busybox, the freshly built memtrace and
//! memtrace-workload with their shared libraries, and `tests/guest/init.sh`
//! as `/init` with the scripts it sources.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::arch::Arch;
use super::Assets;
use crate::root;

/// A cpio archive in the "newc" format the kernel unpacks as initramfs.
#[derive(Default)]
struct Cpio {
    buf: Vec<u8>,
    ino: u32,
    dirs: BTreeSet<String>,
}

impl Cpio {
    fn entry(&mut self, path: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.ino += 1;
        let name = path.trim_start_matches('/');
        let fields = [
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len() as u32,
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0,
        ];
        self.buf.extend_from_slice(b"070701");
        for f in fields {
            self.buf.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    fn dir(&mut self, path: &str) {
        let path = path.trim_matches('/');
        if path.is_empty() || self.dirs.contains(path) {
            return;
        }
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.dir(parent);
        }
        self.dirs.insert(path.to_string());
        self.entry(path, 0o040755, (0, 0), &[]);
    }

    fn parent(&mut self, path: &str) {
        if let Some((parent, _)) = path.trim_start_matches('/').rsplit_once('/') {
            self.dir(parent);
        }
    }

    fn file(&mut self, path: &str, mode: u32, data: &[u8]) {
        self.parent(path);
        self.entry(path, 0o100000 | mode, (0, 0), data);
    }

    fn symlink(&mut self, path: &str, target: &str) {
        self.parent(path);
        self.entry(path, 0o120777, (0, 0), target.as_bytes());
    }

    fn char_dev(&mut self, path: &str, major: u32, minor: u32) {
        self.parent(path);
        self.entry(path, 0o020600, (major, minor), &[]);
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.buf
    }
}

/// The allocator shim the last build embedded (memtrace/build.rs writes it
/// into the build script's out directory).
fn newest_shim(release: &Path) -> Option<PathBuf> {
    std::fs::read_dir(release.join("build"))
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("memtrace-"))
        .map(|e| e.path().join("out/memtrace_preload.so"))
        .filter(|p| p.metadata().is_ok_and(|m| m.len() > 0))
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
}

pub(super) fn initramfs(assets: &Assets, arch: Arch, out: &Path) -> Result<()> {
    let busybox = match arch {
        Arch::X86_64 => assets.qemu_root.join("bin/busybox"),
        Arch::Arm64 => assets.arm64_root.join("bin/busybox"),
    };
    let release = arch.release_dir();
    let mut c = Cpio::default();
    for d in ["dev", "proc", "sys", "tmp", "sbin", "usr/bin", "usr/sbin"] {
        c.dir(d);
    }
    c.char_dev("dev/console", 5, 1);
    c.file("bin/busybox", 0o755, &std::fs::read(busybox)?);
    c.symlink("bin/sh", "busybox");
    // init.sh as /init, the scripts it sources in /lib/guest.
    let guest = root().join("tests/guest");
    c.file("init", 0o755, &std::fs::read(guest.join("init.sh"))?);
    for e in std::fs::read_dir(&guest)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".sh") && name != "init.sh" {
            c.file(
                &format!("lib/guest/{name}"),
                0o644,
                &std::fs::read(e.path())?,
            );
        }
    }
    let mut shared = BTreeSet::new();
    for b in ["memtrace", "memtrace-workload"] {
        let p = release.join(b);
        c.file(
            &format!("bin/{b}"),
            0o755,
            &std::fs::read(&p).with_context(|| format!("{}", p.display()))?,
        );
        shared.extend(arch.libs(&p)?);
    }
    // memleak's shim, written out by memtrace at run time, links libm too.
    if let Some(shim) = newest_shim(&release) {
        shared.extend(arch.libs(&shim)?);
    }
    for (at, from) in shared {
        // At the path the loader looks, with the content of the file.
        c.file(&at.to_string_lossy(), 0o755, &std::fs::read(&from)?);
    }
    // Each kernel's modules where `uname -r` finds them.
    for k in assets.kernels.iter().filter(|k| k.arch == arch) {
        for e in std::fs::read_dir(&k.modules)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            c.file(
                &format!("lib/modules/{}/{name}", k.name),
                0o644,
                &std::fs::read(e.path())?,
            );
        }
    }
    std::fs::write(out, c.finish())?;
    Ok(())
}
