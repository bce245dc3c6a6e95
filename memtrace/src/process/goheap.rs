//! The Go heap in use, by stack, as the Go runtime itself samples it: its
//! memory profile's buckets (`runtime.mbuckets`, one per allocating stack,
//! with the allocations and frees of each collection cycle), read from the
//! running process through `/proc/PID/mem`, nothing put into it. Go's
//! allocator never calls malloc, so this is the only view of the Go heap
//! by function that needs no probe in the allocation path. The layout is
//! the one Go has kept from 1.18 to the newest; the addresses come from the
//! binary's symbol table. Everything read is the traced program's own
//! memory: every length is bounded and a damaged list ends the read.
//! Where the Go linker left profiling off, `turn_on` writes the two words
//! the runtime decides it by (the tools that load memleak's shim do it,
//! unless told not to).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

use object::{Object, ObjectKind, ObjectSection, ObjectSymbol};

/// Buckets read at most: a crafted list cannot keep root reading.
const MAX_BUCKETS: usize = 1 << 20;
/// Frames a bucket may hold (Go keeps 32 by default, up to 1024 asked for).
const MAX_FRAMES: u64 = 1024;
/// Go's default `MemProfileRate`: what memtrace sets where the linker left
/// profiling off.
pub const DEFAULT_RATE: u64 = 512 * 1024;
/// `memProfile`, the bucket type of the heap profile.
const MEM_PROFILE: u64 = 1;
/// next, allnext, typ, hash, size, nstk.
const HEADER: usize = 48;
/// A `memRecordCycle`: allocs, frees, alloc_bytes, free_bytes.
const CYCLE: usize = 32;
/// `memRecord`: the active cycle and three future ones.
const RECORD: usize = 4 * CYCLE;

#[derive(Debug, thiserror::Error)]
pub enum NotRead {
    #[error("not a Go program")]
    NotGo,
    #[error("its symbol table is stripped: the runtime's profile cannot be found")]
    Stripped,
    #[error(
        "Go's heap profiling is off in it (MemProfileRate 0: the Go linker turns it off when \
         nothing in the program uses runtime.MemProfile, as importing runtime/pprof does)"
    )]
    ProfilingOff,
    #[error("reading its memory: {0}")]
    Io(#[from] std::io::Error),
}

/// One allocating stack's figures, summed over the cycles the runtime has
/// (the active one, and those not yet folded into it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bucket {
    /// Return addresses, innermost first.
    pub stack: Vec<u64>,
    pub allocs: u64,
    pub frees: u64,
    pub alloc_bytes: u64,
    pub free_bytes: u64,
}

impl Bucket {
    /// Sampled objects and bytes not freed yet.
    pub fn in_use(&self) -> (u64, u64) {
        (
            self.allocs.saturating_sub(self.frees),
            self.alloc_bytes.saturating_sub(self.free_bytes),
        )
    }
}

#[derive(Debug, Default, Clone)]
pub struct Profile {
    /// `runtime.MemProfileRate`: one sample per this many bytes on average.
    pub rate: u64,
    pub buckets: Vec<Bucket>,
    /// The list ended early: a bucket unreadable or not the heap's, a
    /// loop, or more buckets than are read.
    pub damaged: bool,
}

/// What Go's own profile reports for a sampled stack: the objects and
/// bytes it stands for, as `runtime/pprof` scales them (the chance that an
/// allocation of the average size was sampled).
pub fn estimate(objects: u64, bytes: u64, rate: u64) -> (u64, u64) {
    if objects == 0 || bytes == 0 || rate <= 1 {
        return (objects, bytes);
    }
    let avg = bytes as f64 / objects as f64;
    let scale = 1.0 / (1.0 - (-avg / rate as f64).exp());
    (
        (objects as f64 * scale).round() as u64,
        (bytes as f64 * scale).round() as u64,
    )
}

pub struct GoHeap {
    mem: File,
    buckets_at: u64,
    rate_at: u64,
    /// `runtime.disableMemoryProfiling`, where the linker set it.
    off_at: Option<u64>,
    pid: u32,
    /// Opened to write once profiling is turned on (the same process's
    /// memory for as long as it lives, whatever its pid becomes).
    written: OnceLock<File>,
}

/// Sections only the Go toolchain writes.
const GO_SECTIONS: [&str; 3] = [".note.go.buildid", ".gopclntab", ".go.buildinfo"];

/// Whether `obj` was built by the Go toolchain.
pub fn is_go<'d, R: object::ReadRef<'d>>(obj: &object::File<'d, R>) -> bool {
    GO_SECTIONS
        .into_iter()
        .any(|s| obj.section_by_name(s).is_some())
}

/// Whether the ELF file is a Go program.
pub fn is_go_file(file: &File) -> bool {
    let cache = object::ReadCache::new(file);
    object::File::parse(&cache).is_ok_and(|obj| is_go(&obj))
}

impl GoHeap {
    /// The profile of Go process `pid`.
    pub fn open(pid: u32) -> Result<GoHeap, NotRead> {
        let exe = File::open(format!("/proc/{pid}/exe"))?;
        let (buckets, rate, off, pie) = {
            let cache = object::ReadCache::new(&exe);
            let obj = object::File::parse(&cache).map_err(|_| NotRead::NotGo)?;
            if !is_go(&obj) {
                return Err(NotRead::NotGo);
            }
            let find = |name: &str| {
                obj.symbols()
                    .find(|s| s.name() == Ok(name))
                    .map(|s| s.address())
            };
            let (Some(b), Some(r)) = (find("runtime.mbuckets"), find("runtime.MemProfileRate"))
            else {
                return Err(NotRead::Stripped);
            };
            // Set by the linker in the file's data: known before the
            // runtime runs (which only then sets the rate).
            let off = find("runtime.disableMemoryProfiling").filter(|&a| {
                let sec = obj
                    .sections()
                    .find(|s| a >= s.address() && a < s.address() + s.size());
                sec.and_then(|s| s.data_range(a, 1).ok().flatten()) == Some(&[1u8][..])
            });
            (b, r, off, obj.kind() == ObjectKind::Dynamic)
        };
        let bias = if pie { load_bias(pid, &exe)? } else { 0 };
        let mem = File::open(format!("/proc/{pid}/mem"))?;
        Ok(GoHeap {
            mem,
            buckets_at: buckets + bias,
            rate_at: rate + bias,
            off_at: off.map(|a| a + bias),
            pid,
            written: OnceLock::new(),
        })
    }

    /// Whether the Go linker left heap profiling off in the program.
    pub fn linker_off(&self) -> bool {
        self.off_at.is_some()
    }

    /// Turns profiling on at Go's default rate: before the runtime starts,
    /// by clearing the linker's flag (it keeps its rate then); once it
    /// runs, by setting the rate it zeroed. Only these two words of the
    /// program are written.
    pub fn turn_on(&self) -> std::io::Result<()> {
        let Some(off_at) = self.off_at else {
            return Ok(());
        };
        let f = match self.written.get() {
            Some(f) => f,
            None => {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(format!("/proc/{}/mem", self.pid))?;
                self.written.get_or_init(|| f)
            }
        };
        f.write_all_at(&[0], off_at)?;
        if self.word(self.rate_at)? == 0 {
            f.write_all_at(&DEFAULT_RATE.to_le_bytes(), self.rate_at)?;
        }
        Ok(())
    }

    /// Puts profiling back off where it was turned on and its rate is still
    /// the one memtrace set; the buckets stay (nothing in the program
    /// reads them).
    pub fn put_back(&self) {
        let Some(f) = self.written.get() else {
            return;
        };
        if self.word(self.rate_at).ok() == Some(DEFAULT_RATE) {
            let _ = f.write_all_at(&0u64.to_le_bytes(), self.rate_at);
        }
    }

    fn word(&self, at: u64) -> std::io::Result<u64> {
        let mut b = [0u8; 8];
        self.mem.read_exact_at(&mut b, at)?;
        Ok(u64::from_le_bytes(b))
    }

    /// The buckets as they are now.
    pub fn read(&self) -> Result<Profile, NotRead> {
        let rate = self.word(self.rate_at)?;
        let mut p = Profile {
            rate,
            ..Default::default()
        };
        // Rate 0: the runtime has not started yet, or the program turned
        // profiling off; the buckets kept before are read all the same.
        let mut at = self.word(self.buckets_at)?;
        let mut head = [0u8; HEADER];
        while at != 0 {
            if p.buckets.len() >= MAX_BUCKETS || self.mem.read_exact_at(&mut head, at).is_err() {
                p.damaged = true;
                break;
            }
            let w = |i: usize| u64::from_le_bytes(head[8 * i..8 * i + 8].try_into().unwrap());
            let (allnext, typ, nstk) = (w(1), w(2), w(5));
            if typ != MEM_PROFILE || nstk > MAX_FRAMES {
                p.damaged = true;
                break;
            }
            let mut rest = vec![0u8; nstk as usize * 8 + RECORD];
            if self
                .mem
                .read_exact_at(&mut rest, at + HEADER as u64)
                .is_err()
            {
                p.damaged = true;
                break;
            }
            p.buckets.push(parse_bucket(&rest, nstk as usize));
            at = allnext;
        }
        Ok(p)
    }
}

impl Drop for GoHeap {
    fn drop(&mut self) {
        self.put_back();
    }
}

/// A bucket's stack and record, from the bytes after its header.
fn parse_bucket(rest: &[u8], nstk: usize) -> Bucket {
    let w = |i: usize| u64::from_le_bytes(rest[8 * i..8 * i + 8].try_into().unwrap());
    let mut b = Bucket {
        stack: (0..nstk).map(w).filter(|&pc| pc != 0).collect(),
        ..Default::default()
    };
    for c in 0..4 {
        let base = nstk + 4 * c;
        b.allocs += w(base);
        b.frees += w(base + 1);
        b.alloc_bytes += w(base + 2);
        b.free_bytes += w(base + 3);
    }
    b
}

/// Where a position-independent executable is loaded: its first mapping
/// (at file offset 0) minus the address the file states for that byte (0
/// for what the Go linker writes).
fn load_bias(pid: u32, exe: &File) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let md = exe.metadata()?;
    let maps = super::maps::read_maps(pid).unwrap_or_default();
    maps.iter()
        .find(|m| m.inode == md.ino() && m.offset == 0)
        .map(|m| m.start)
        .ok_or_else(|| std::io::Error::other("its executable is not mapped"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_scales_a_sample_by_the_chance_it_was_taken() {
        // One 64 KiB object sampled at the default rate stands for 1/(1 -
        // e^-0.125) of itself: about 8.5 objects.
        let (n, b) = estimate(1, 65536, 512 * 1024);
        assert_eq!(n, 9);
        assert!((557_000..558_000).contains(&b), "{b}");
        // Objects far larger than the rate are all sampled.
        assert_eq!(estimate(10, 10 << 30, 512 * 1024), (10, 10 << 30));
        // Every allocation sampled (rate 1), or nothing: as they are.
        assert_eq!(estimate(3, 300, 1), (3, 300));
        assert_eq!(estimate(0, 0, 512 * 1024), (0, 0));
    }

    #[test]
    fn a_bucket_sums_its_cycles() {
        let mut rest = Vec::new();
        for pc in [0x401000u64, 0x402000] {
            rest.extend(pc.to_le_bytes());
        }
        // active, then three future cycles: allocs, frees, bytes, freed.
        for c in [
            [4u64, 1, 400, 100],
            [2, 0, 200, 0],
            [0; 4],
            [1, 1, 100, 100],
        ] {
            for v in c {
                rest.extend(v.to_le_bytes());
            }
        }
        let b = parse_bucket(&rest, 2);
        assert_eq!(b.stack, [0x401000, 0x402000]);
        assert_eq!(b.in_use(), (5, 500));
    }
}
