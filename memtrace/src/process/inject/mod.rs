//! Loading memleak's allocator shim into a running process and pointing
//! the process's allocator calls at it, then putting every call back: what
//! heaptrack does through gdb, done with ptrace and /proc/PID/mem.
//!
//! 1. `load`: every thread is held; one blocked in a system call (not a
//!    futex) calls glibc's `dlopen` on the shim, then the shim's
//!    `memtrace_injected` (its sampling rate; it forwards to what the
//!    process's own lookups find), then `dlsym` once per function the shim
//!    defines, to learn where the process binds each. The threads go on.
//! 2. `redirect`, once memleak's probes are on the shim: held again, every
//!    GOT slot of every loaded object that binds one of those functions to
//!    where the process binds it (or to its own lazy-binding stub) is
//!    rewritten to the shim's.
//! 3. `restore` (also on drop): held again, every slot still holding the
//!    shim's address gets its old value back. The shim stays mapped (a
//!    thread may be inside it); without memtrace's probes its report sites
//!    are nops, so a memtrace killed before restoring leaves a process
//!    that still works.

mod calm;
mod got;
mod late;
mod memfd;
mod objects;
mod ptrace;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use calm::{busy, hold_calm, locking};
use objects::{file_name, functions, loaded};
use ptrace::{Held, DATA};

/// Why the shim was not loaded (one line, said before uprobes take over).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotInjected(pub String);

pub(super) type Result<T> = std::result::Result<T, NotInjected>;

fn no(why: impl Into<String>) -> NotInjected {
    NotInjected(why.into())
}

/// The allocator's own entry points: always sent through the shim, which
/// forwards each to where the process binds it (with `PRIMITIVES`).
pub(super) const ALLOCATOR: &[&str] = &[
    "malloc",
    "free",
    "calloc",
    "realloc",
    "reallocarray",
    "memalign",
    "aligned_alloc",
    "posix_memalign",
    "valloc",
    "pvalloc",
];
/// The other calls the shim always takes: its mmaps, its dlsym.
const PRIMITIVES: &[&str] = &["mmap", "mmap64", "munmap", "dlsym"];
/// What the shim defines that a running process must keep as it is: the
/// exec wrappers carry a preload to children, the sites are memtrace's.
fn never(name: &str) -> bool {
    name.starts_with("memtrace_")
        || matches!(
            name,
            "execve"
                | "fexecve"
                | "execvpe"
                | "execvp"
                | "execv"
                | "posix_spawn"
                | "posix_spawnp"
                | "_init"
                | "_fini"
                | "setuid"
                | "seteuid"
                | "setreuid"
                | "setresuid"
                | "setgid"
                | "setegid"
                | "setregid"
                | "setresgid"
                | "setgroups"
        )
}

/// A function the shim takes over in the process.
struct Target {
    name: String,
    /// Where the process binds it (dlsym from the main program).
    theirs: u64,
    ours: u64,
}

pub struct Injected {
    pid: u32,
    /// The shim as memtrace reaches it (for the probes on its sites).
    pub shim: PathBuf,
    /// Its `(dev, inode)`, to know its mapping by.
    shim_id: (u64, u64),
    /// The process's own sealed copy, when it has one (`memfd`): open while
    /// the probes attach through it.
    _copy: Option<memfd::Copy>,
    /// The file that defines the process's malloc.
    pub allocator: String,
    /// Functions the shim defines but the process gets from elsewhere (a
    /// C++ operator new of the program's own): left alone.
    pub kept: Vec<String>,
    targets: Vec<Target>,
    /// Slots rewritten: address, old value, the shim's.
    slots: Vec<(u64, u64, u64)>,
    /// The shim's `memtrace_flush_all`: the frees its threads still hold in
    /// batches, reported before it is taken out.
    flush_all: Option<u64>,
    restored: bool,
    /// Files whose code the last redirect found mapped and done with
    /// (`late.rs`): one mapped since is a library loaded later.
    known: HashSet<String>,
    /// Redirects that found a file's slots not yet written by the loader.
    unsettled: HashMap<String, u8>,
    /// The files the last redirect pointed slots of at the shim.
    pub newly: Vec<(String, usize)>,
}

/// Why `pid` must not be stopped and made to load a library, if so.
fn unsafe_to_enter(pid: u32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_string())
    };
    if field("Seccomp:").is_some_and(|v| v != "0") {
        return Some("it runs under seccomp (a system call of the load could kill it)".into());
    }
    if let Some(t) = field("TracerPid:").filter(|t| t != "0") {
        return Some(format!("it is already traced by pid {t}"));
    }
    None
}

/// Whether `pid` shares memtrace's mount namespace (the shim's file is
/// then its to map; else it gets a sealed memfd of its own, `memfd`).
fn same_mounts(pid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).ok();
    // And the same root: a chroot resolves the shim's path in its own tree.
    let root = |p: &str| {
        std::fs::metadata(format!("/proc/{p}/root"))
            .ok()
            .map(|m| (m.dev(), m.ino()))
    };
    ns("self").is_some()
        && ns("self") == ns(&pid.to_string())
        && root("self").is_some()
        && root("self") == root(&pid.to_string())
}

impl Injected {
    /// Loads the shim (`image`, installed at `shim` for this mount
    /// namespace) into `pid`, sampling as asked (0: every call).
    pub fn load(pid: u32, shim: &Path, image: &[u8], sample: u64) -> Result<Injected> {
        if !cfg!(target_arch = "x86_64") {
            return Err(no("injection is built for x86-64 only"));
        }
        if let Some(why) = unsafe_to_enter(pid) {
            return Err(no(why));
        }
        let libs = loaded(pid);
        let libc = libs
            .iter()
            .find(|l| file_name(&l.shown).starts_with("libc.so.6"))
            .ok_or_else(|| no("it does not map glibc (static, or another C library)"))?;
        let libc = functions(libc);
        let dlopen = libc.get("dlopen").copied().or_else(|| {
            let dl = libs
                .iter()
                .find(|l| file_name(&l.shown).starts_with("libdl.so"))?;
            functions(dl).get("dlopen").copied()
        });
        let (Some(dlopen), Some(dlsym), Some(dlerror)) = (
            dlopen,
            libc.get("dlsym").copied(),
            libc.get("dlerror").copied(),
        ) else {
            return Err(no(
                "its glibc has no dlopen it can call (before 2.34, without libdl)",
            ));
        };
        let (mut held, tid) = hold_calm(pid, &busy(&libs), &locking(pid, &libs))?;
        let call = |h: &mut Held, f: u64, args: &[u64], data: &[u8]| {
            h.call(tid, f, args, data)
                .map_err(|e| no(format!("calling into thread {tid}: {e}")))
        };
        // The calls below set the thread's errno: put back at the end.
        let errno = match libc.get("__errno_location") {
            Some(&f) => {
                let at = call(&mut held, f, &[], &[])?;
                held.read_u64(at).ok().map(|v| (at, v as u32))
            }
            None => None,
        };
        let (path, copy) = if same_mounts(pid) {
            (shim.display().to_string(), None)
        } else {
            let syscall = libc
                .get("syscall")
                .copied()
                .ok_or_else(|| no("its glibc has no syscall()"))?;
            let c = memfd::create(&mut held, pid, tid, syscall, image)?;
            (format!("/proc/self/fd/{}", c.theirs), Some(c))
        };
        let shim_id = match &copy {
            Some(c) => c.id,
            None => std::fs::File::open(shim)
                .and_then(|f| memfd::identity(&f))
                .map_err(|e| no(format!("the shim: {e}")))?,
        };
        let cpath = [path.as_bytes(), b"\0"].concat();
        if call(&mut held, dlopen, &[DATA, libc::RTLD_NOW as u64], &cpath)? == 0 {
            let msg = call(&mut held, dlerror, &[], &[])?;
            let msg = if msg == 0 {
                String::new()
            } else {
                held.string(msg, 512)
            };
            return Err(no(format!("its dlopen of the shim failed: {msg}")));
        }
        if let (Some(c), Some(&close)) = (&copy, libc.get("close")) {
            call(&mut held, close, &[c.theirs as u64], &[])?;
        }
        let libs = loaded(pid);
        let me = libs
            .iter()
            .find(|l| l.id == shim_id)
            .ok_or_else(|| no("the shim is not in its maps after dlopen"))?;
        // Parsed from memtrace's own bytes, not read back from the process.
        let ours: HashMap<String, u64> = got::exports(image)
            .map_err(|e| no(format!("the shim: {e}")))?
            .into_iter()
            .map(|(n, a)| (n, me.bias + a))
            .collect();
        let ready = ours
            .get("memtrace_injected")
            .copied()
            .ok_or_else(|| no("the shim has no memtrace_injected"))?;
        if call(&mut held, ready, &[sample], &[])? as i32 != 0 {
            return Err(no("the shim found no malloc to forward to"));
        }
        let mut targets = Vec::new();
        let mut names: Vec<&String> = ours.keys().filter(|n| !never(n)).collect();
        names.sort();
        for name in names {
            let cname = [name.as_bytes(), b"\0"].concat();
            let theirs = call(&mut held, dlsym, &[0, DATA], &cname)?;
            if theirs != 0 {
                targets.push(Target {
                    name: name.clone(),
                    theirs,
                    ours: ours[name],
                });
            }
        }
        if let Some((at, v)) = errno {
            let _ = held.write(at, &v.to_ne_bytes());
        }
        drop(held);
        let owner = |a: u64| libs.iter().find(|l| (l.span.0..l.span.1).contains(&a));
        if let Some(why) = behind_plt(&targets, &libs) {
            return Err(no(why));
        }
        let malloc = targets
            .iter()
            .find(|t| t.name == "malloc")
            .map(|t| t.theirs);
        let allocator = malloc
            .and_then(owner)
            .map(|l| l.shown.clone())
            .unwrap_or_default();
        // The shim's other functions (C++ new and delete, jemalloc's API)
        // are built on malloc and free: they stand in only for versions
        // that are too (the C++ library's, the allocator's own).
        let mut kept = Vec::new();
        targets.retain(|t| {
            let from = owner(t.theirs)
                .map(|l| file_name(&l.shown).to_string())
                .unwrap_or_default();
            let fits = ALLOCATOR.contains(&t.name.as_str())
                || PRIMITIVES.contains(&t.name.as_str())
                || from.starts_with("libstdc++")
                || from.starts_with("libc++")
                || from.starts_with("libc.so")
                || (!allocator.is_empty() && from == file_name(&allocator));
            if !fits {
                kept.push(t.name.clone());
            }
            fits
        });
        Ok(Injected {
            pid,
            shim: copy
                .as_ref()
                .map_or_else(|| shim.to_path_buf(), |c| c.path()),
            shim_id,
            _copy: copy,
            allocator,
            kept,
            targets,
            slots: Vec::new(),
            flush_all: ours.get("memtrace_flush_all").copied(),
            restored: false,
            known: HashSet::new(),
            unsettled: HashMap::new(),
            newly: Vec::new(),
        })
    }

    /// Whether the process got a sealed copy of its own (`memfd`), which
    /// only it and its forks map: probes on it need no process filter.
    pub fn own_copy(&self) -> bool {
        self._copy.is_some()
    }

    /// Points every loaded object's calls of the shim's functions at it.
    /// Returns the slots and objects rewritten.
    pub fn redirect(&mut self) -> Result<(usize, usize)> {
        let held = Held::all(self.pid).map_err(|e| no(format!("cannot stop its threads: {e}")))?;
        let names: Vec<&str> = self.targets.iter().map(|t| t.name.as_str()).collect();
        let mut objects = 0;
        let mut known = self.mapped_code();
        self.newly.clear();
        for l in loaded(self.pid) {
            let name = file_name(&l.shown);
            if l.id == self.shim_id || name.starts_with("ld-linux") || name.starts_with("ld64") {
                continue;
            }
            let Ok(data) = crate::process::maps::read_object(&l.host) else {
                continue;
            };
            let Ok(slots) = got::slots(&data, &names) else {
                continue;
            };
            let before = self.slots.len();
            let mut settled = true;
            for s in slots {
                let t = self
                    .targets
                    .iter()
                    .find(|t| t.name == s.name)
                    .expect("a named target");
                let at = l.bias + s.offset;
                let Ok(now) = held.read_u64(at) else { continue };
                // Bound where the process binds it, or not bound yet (its
                // own lazy-binding stub, which would bind it there).
                let lazy = (l.span.0..l.span.1).contains(&now);
                if (now == t.theirs || lazy) && held.write(at, &t.ours.to_ne_bytes()).is_ok() {
                    self.slots.push((at, now, t.ours));
                } else if now != t.ours {
                    settled = false;
                }
            }
            let done = self.slots.len() - before;
            objects += usize::from(done > 0);
            if done > 0 {
                self.newly.push((l.shown.clone(), done));
            }
            late::settle(&mut self.unsettled, &mut known, &l.shown, settled);
        }
        self.known = known;
        Ok((self.slots.len(), objects))
    }

    /// Puts every rewritten slot back. Returns how many were, and how many
    /// the process had rewritten since (left as it made them); None when
    /// there is nothing to put back into (it exited or exec'd).
    /// Lets go without putting anything back: the image it was loaded into
    /// is gone (an exec).
    pub fn abandon(&mut self) {
        self.restored = true;
    }

    pub fn restore(&mut self) -> Result<Option<(usize, usize)>> {
        self.restored = true;
        if self.slots.is_empty() {
            return Ok(Some((0, 0)));
        }
        let mut held = match Held::all(self.pid) {
            Ok(h) => h,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) => {
                return Ok(None)
            }
            Err(e) => return Err(no(format!("cannot stop its threads: {e}"))),
        };
        if !loaded(self.pid).iter().any(|l| l.id == self.shim_id) {
            return Ok(None);
        }
        let (mut put, mut changed) = (0, 0);
        for &(at, old, ours) in &self.slots {
            match held.read_u64(at) {
                Ok(v) if v == ours => {
                    put += usize::from(held.write(at, &old.to_ne_bytes()).is_ok())
                }
                _ => changed += 1,
            }
        }
        // Every thread is held: no batch changes while it is read.
        if let Some(f) = self.flush_all {
            let libs = loaded(self.pid);
            let tid = held
                .calm_thread(&busy(&libs), &locking(self.pid, &libs))
                .unwrap_or(held.first());
            held.call(tid, f, &[], &[])
                .map_err(|e| no(format!("reporting its batched frees: {e}")))?;
        }
        Ok(Some((put, changed)))
    }
}

impl Drop for Injected {
    fn drop(&mut self) {
        if !self.restored {
            let _ = self.restore();
        }
    }
}

/// Why the shim cannot stand in, where dlsym answered `malloc` or `free`
/// with a canonical PLT entry (an address in an object that does not
/// define it: a non-PIE executable that takes its address, as Debian's
/// python3 does). The executable's own slot holds the definition, not that
/// entry, and was left as it was: its calls went to the allocator unseen.
/// Uprobes on the allocator see every call.
fn behind_plt(targets: &[Target], libs: &[objects::Loaded]) -> Option<String> {
    let mut defs: HashMap<usize, HashMap<String, u64>> = HashMap::new();
    for t in targets
        .iter()
        .filter(|t| t.name == "malloc" || t.name == "free")
    {
        let i = libs
            .iter()
            .position(|l| (l.span.0..l.span.1).contains(&t.theirs))?;
        let d = defs.entry(i).or_insert_with(|| functions(&libs[i]));
        if d.get(&t.name) != Some(&t.theirs) {
            return Some(format!(
                "{} binds {} to a PLT entry of its own (a non-PIE executable that takes its address), which its own calls do not go through",
                libs[i].shown, t.name
            ));
        }
    }
    None
}
