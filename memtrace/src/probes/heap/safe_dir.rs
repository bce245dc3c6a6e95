//! Where memtrace, as root, writes the allocator shim that other processes
//! then map and run: never a path another user controls. Either
//! `/run/memtrace` (made by memtrace, owned by root, written by no one
//! else), or a directory of this run's own, made under a shared
//! temporary directory with a random name (its sticky bit keeps other
//! users from renaming or removing it). Every step is taken from the
//! directory opened before it and checked with `fstat` on what was
//! opened, not on a path; no symlink is followed; the file is created
//! `O_EXCL` under a random name, never taken over from a file found there.

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{self, AtFlags, Mode, OFlags, StatVfsMountFlags};
use rustix::io::Errno;

/// The shim written for this run, removed (with a directory of its own)
/// when dropped: mappings of it stay valid.
pub struct Installed {
    path: PathBuf,
    dir: OwnedFd,
    name: String,
    /// The run's own directory and the directory it was made in.
    made: Option<(OwnedFd, String)>,
    how: String,
}

impl Installed {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where it went and why that is safe, for `-v`.
    pub fn how(&self) -> &str {
        &self.how
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = fs::unlinkat(&self.dir, self.name.as_str(), AtFlags::empty());
        if let Some((parent, name)) = &self.made {
            let _ = fs::unlinkat(parent, name.as_str(), AtFlags::REMOVEDIR);
        }
    }
}

/// 16 random hex digits: names others cannot guess or take first.
pub fn random_hex() -> std::io::Result<String> {
    let mut b = [0u8; 8];
    rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty())?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

const DIR: OFlags = OFlags::DIRECTORY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC)
    .union(OFlags::RDONLY);

/// Why a directory opened as `fd` may not hold what root writes: not
/// root's, or writable by others (`sticky_ok`: unless sticky, for a shared
/// temporary directory that only holds the run's own).
fn untrusted(fd: impl AsFd, sticky_ok: bool) -> Option<String> {
    let st = match fs::fstat(fd) {
        Ok(st) => st,
        Err(e) => return Some(format!("cannot stat it: {e}")),
    };
    if st.st_uid != 0 {
        return Some(format!("owned by uid {}, not root", st.st_uid));
    }
    let mode = st.st_mode;
    if mode & 0o022 != 0 && !(sticky_ok && mode & 0o1000 != 0) {
        return Some(format!("writable by others (mode {:o})", mode & 0o7777));
    }
    None
}

/// Opens `dir` component by component from `/`, each checked: a
/// directory, no symlink, root's, written by no one else (the last one may
/// be sticky when `sticky_last`).
pub fn open_trusted(dir: &Path, sticky_last: bool) -> Result<OwnedFd, String> {
    let mut fd = fs::open("/", DIR, Mode::empty()).map_err(|e| format!("/: {e}"))?;
    let parts: Vec<_> = dir.components().collect();
    for (i, c) in parts.iter().enumerate() {
        let name = match c {
            Component::RootDir => continue,
            Component::Normal(n) => *n,
            _ => return Err("not a plain absolute path".into()),
        };
        let next = fs::openat(&fd, name, DIR, Mode::empty()).map_err(|e| match e {
            Errno::LOOP | Errno::NOTDIR => {
                format!("{} is a symlink or not a directory", dir.display())
            }
            e => e.to_string(),
        })?;
        let last = i + 1 == parts.len();
        // A sticky shared directory on the way: only root's entries in it.
        if let Some(why) = untrusted(&next, sticky_last || !last) {
            return Err(why);
        }
        fd = next;
    }
    Ok(fd)
}

fn noexec(fd: impl AsFd) -> bool {
    fs::fstatvfs(fd).is_ok_and(|v| v.f_flag.contains(StatVfsMountFlags::NOEXEC))
}

/// Writes `data` as a new file `PREFIX<pid>-<random>.so` in `dir` (made if
/// missing), or with `private`, in a new directory of this run's own under
/// `dir` (a shared temporary directory).
pub fn place(dir: &Path, private: bool, data: &[u8], prefix: &str) -> Result<Installed, String> {
    let (dir_fd, dir_path, made) = if private {
        let parent = open_trusted(dir, true)?;
        if noexec(&parent) {
            return Err("mounted noexec".into());
        }
        let name = format!("memtrace-{}", random_hex().map_err(|e| e.to_string())?);
        fs::mkdirat(&parent, name.as_str(), Mode::from_raw_mode(0o700))
            .map_err(|e| format!("cannot make {name}: {e}"))?;
        let fd = fs::openat(&parent, name.as_str(), DIR, Mode::empty())
            .map_err(|e| format!("cannot open {name}: {e}"))?;
        // Made just now by this run: anything else there is not ours.
        if let Some(why) = untrusted(&fd, false) {
            return Err(format!("{name}: {why}"));
        }
        // Readable by the command's processes of other users.
        fs::fchmod(&fd, Mode::from_raw_mode(0o755)).map_err(|e| e.to_string())?;
        (fd, dir.join(&name), Some((parent, name)))
    } else {
        let parent = dir.parent().ok_or("no parent")?;
        let leaf = dir.file_name().ok_or("no name")?;
        let pfd = open_trusted(parent, false)?;
        match fs::mkdirat(&pfd, leaf, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(format!("cannot make it: {e}")),
        }
        let fd = fs::openat(&pfd, leaf, DIR, Mode::empty()).map_err(|e| match e {
            Errno::LOOP | Errno::NOTDIR => "a symlink or not a directory".to_string(),
            e => e.to_string(),
        })?;
        if let Some(why) = untrusted(&fd, false) {
            return Err(why);
        }
        // Made through the umask (0700 under 077): the command's processes
        // of other users must reach the shim.
        fs::fchmod(&fd, Mode::from_raw_mode(0o755)).map_err(|e| e.to_string())?;
        if noexec(&fd) {
            return Err("mounted noexec".into());
        }
        sweep(&fd, prefix);
        (fd, dir.to_path_buf(), None)
    };
    let name = format!(
        "{prefix}{}-{}.so",
        std::process::id(),
        random_hex().map_err(|e| e.to_string())?
    );
    let file = fs::openat(
        &dir_fd,
        name.as_str(),
        OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::WRONLY | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| format!("cannot create {name}: {e}"))?;
    let mut installed = Installed {
        path: dir_path.join(&name),
        how: String::new(),
        dir: dir_fd,
        name,
        made,
    };
    let mut f = std::fs::File::from(file);
    f.write_all(data).map_err(|e| e.to_string())?;
    // Read and mapped by the command's processes, written by no one.
    fs::fchmod(&f, Mode::from_raw_mode(0o444)).map_err(|e| e.to_string())?;
    installed.how = format!(
        "{} (created for this run in {}, root's and written by no one else; removed at exit)",
        installed.path.display(),
        if private {
            "a directory of its own"
        } else {
            "a root-only directory"
        }
    );
    Ok(installed)
}

/// Removes the shims earlier runs left (killed before their exit) whose
/// memtrace is gone.
fn sweep(dir: &OwnedFd, prefix: &str) {
    let Ok(d) = fs::Dir::read_from(dir) else {
        return;
    };
    for e in d.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let alive = rustix::process::Pid::from_raw(pid)
            .is_some_and(|p| rustix::process::test_kill_process(p).is_ok());
        if !alive {
            if let Ok(c) = CString::new(name) {
                let _ = fs::unlinkat(dir, c.as_c_str(), AtFlags::empty());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_another_user_owns_or_can_write_is_refused() {
        let base = std::env::temp_dir().join(format!("safe-dir-test-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        let theirs = base.join("theirs");
        std::fs::create_dir_all(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
        let open = base.join("open");
        std::fs::create_dir_all(&open).unwrap();
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let link = base.join("link");
        let _ = std::os::unix::fs::symlink(&base, &link);
        let e = place(&theirs, false, b"x", "p-").err().unwrap();
        assert!(e.contains("uid 65534"), "{e}");
        let e = place(&open, false, b"x", "p-").err().unwrap();
        assert!(e.contains("writable by others"), "{e}");
        let e = open_trusted(&link, false).err().unwrap();
        assert!(e.contains("symlink"), "{e}");
        // Its own directory under a world-writable sticky one is fine.
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o1777))
            .unwrap();
        let i = place(&open, true, b"shim", "p-").unwrap();
        assert_eq!(std::fs::read(i.path()).unwrap(), b"shim");
        let made = i.path().parent().unwrap().to_path_buf();
        drop(i);
        assert!(!made.exists());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
