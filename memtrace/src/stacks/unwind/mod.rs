//! `--stack-mode dwarf`: user stacks unwound here, from the registers and a
//! copy of the top of the stack taken in the kernel, with each binary's
//! `.eh_frame` (framehop), so that they pass through code built without
//! frame pointers, glibc included. Unwound stacks are then aggregated here
//! for the counting tools, and symbolized like any other stack.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::sync::Arc;

#[cfg(target_arch = "aarch64")]
use framehop::aarch64::{
    CacheAarch64 as ArchCache, UnwindRegsAarch64 as ArchRegs, UnwinderAarch64 as ArchUnwinder,
};
#[cfg(target_arch = "x86_64")]
use framehop::x86_64::{
    CacheX86_64 as ArchCache, UnwindRegsX86_64 as ArchRegs, UnwinderX86_64 as ArchUnwinder,
};
use framehop::{Error as UnwindError, ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use memtrace_common::stacks::StackSample;
use object::{Object, ObjectSection, ObjectSegment};

use crate::stacks::symbolize::{Mapping, MapsCache};

mod samples;
#[cfg(test)]
mod tests;
pub use samples::{DwarfStacks, SampleKey, SampleVal};

/// The registers unwinding starts from. arm64's return address is in the
/// link register until the function saves it (a leaf never does).
fn regs_of(s: &StackSample) -> ArchRegs {
    #[cfg(target_arch = "aarch64")]
    let r = ArchRegs::new(s.lr, s.sp, s.bp);
    #[cfg(target_arch = "x86_64")]
    let r = ArchRegs::new(s.ip, s.sp, s.bp);
    r
}

/// Most frames kept per stack, as the kernel's own walker.
const MAX_FRAMES: usize = 127;

type Data = Arc<[u8]>;
type FileId = ((u32, u32), u64);

/// The sections of one binary that unwinding needs, read once per file.
struct ObjectInfo {
    text: Option<Range<u64>>,
    eh_frame: Option<(Range<u64>, Data)>,
    eh_frame_hdr: Option<(Range<u64>, Data)>,
    debug_frame: Option<Data>,
    /// (file offset, file size, virtual address) of each executable segment.
    segments: Vec<(u64, u64, u64)>,
}

/// (file offset, file size, virtual address) of each executable segment of
/// `obj`: where a code address in the file lands in its mapping.
pub fn exec_segments<'d, R: object::ReadRef<'d>>(
    obj: &object::File<'d, R>,
) -> Vec<(u64, u64, u64)> {
    obj.segments()
        .filter(|s| {
            matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0)
        })
        .map(|s| {
            let (off, size) = s.file_range();
            (off, size, s.address())
        })
        .collect()
}

impl ObjectInfo {
    fn read(file: &File) -> Option<ObjectInfo> {
        // Reads only the headers and the sections asked for, not the file.
        let cache = object::ReadCache::new(file);
        let obj = object::File::parse(&cache).ok()?;
        let section = |name: &str| {
            let s = obj.section_by_name(name)?;
            // Inflated where compressed (Go's `.debug_frame`).
            let bytes = crate::stacks::sections::section_bytes(&obj, name).ok()??;
            let data: Data = Arc::from(&*bytes);
            Some((s.address()..s.address() + s.size(), data))
        };
        let info = ObjectInfo {
            text: obj
                .section_by_name(".text")
                .map(|s| s.address()..s.address() + s.size()),
            eh_frame: section(".eh_frame"),
            eh_frame_hdr: section(".eh_frame_hdr"),
            debug_frame: section(".debug_frame").map(|(_, d)| d),
            segments: exec_segments(&obj),
        };
        Some(info)
    }

    /// Bytes held for this file's unwind sections.
    fn bytes(&self) -> usize {
        let len = |d: &Option<(Range<u64>, Data)>| d.as_ref().map_or(0, |(_, d)| d.len());
        len(&self.eh_frame)
            + len(&self.eh_frame_hdr)
            + self.debug_frame.as_ref().map_or(0, |d| d.len())
    }

    fn has_unwind_info(&self) -> bool {
        self.eh_frame.is_some() || self.debug_frame.is_some()
    }

    /// Load bias of an executable mapping of this file: the actual address
    /// minus the address the file states for the same byte. The mapping
    /// starts at the segment's offset rounded down to a page.
    fn bias(&self, m: &Mapping) -> Option<u64> {
        let page = crate::kernel::btf::page_size();
        let (off, _, vaddr) = self.segments.iter().find(|(off, size, _)| {
            off / page * page <= m.offset && m.offset < off + (*size).max(1)
        })?;
        Some(
            m.start
                .wrapping_sub(m.offset)
                .wrapping_add(*off)
                .wrapping_sub(*vaddr),
        )
    }
}

/// How unwinding a sample ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum End {
    /// Reached the outermost frame.
    Complete,
    /// Ran off the end of the copied stack (`--stack-size` too small).
    Truncated,
    /// Reached code without unwind information.
    NoUnwindInfo,
    /// The process's maps were gone before the sample could be unwound.
    NoMaps,
    /// Anything else: a bad return address, a frame that did not advance.
    Failed,
}

impl End {
    pub fn note(self) -> Option<&'static str> {
        match self {
            End::Complete => None,
            End::Truncated => {
                Some("unwinding reached the end of the copied stack (raise --stack-size)")
            }
            End::NoUnwindInfo => Some("unwinding reached code without unwind info"),
            End::NoMaps => Some("the process exited before its maps were read"),
            End::Failed => Some("unwinding failed part way"),
        }
    }
}

/// Per-sample outcome counts, shown in the summary.
#[derive(Debug, Default, Clone, Copy)]
pub struct UnwindStats {
    pub samples: u64,
    pub complete: u64,
    pub truncated: u64,
    pub no_unwind_info: u64,
    pub no_maps: u64,
    pub failed: u64,
}

impl UnwindStats {
    fn count(&mut self, end: End) {
        self.samples += 1;
        *match end {
            End::Complete => &mut self.complete,
            End::Truncated => &mut self.truncated,
            End::NoUnwindInfo => &mut self.no_unwind_info,
            End::NoMaps => &mut self.no_maps,
            End::Failed => &mut self.failed,
        } += 1;
    }
}

struct Proc {
    unwinder: ArchUnwinder<Data>,
    /// Every executable mapping when the modules were built: an ip outside
    /// them means code mapped since (dlopen, JIT), so the maps are read again.
    exec: Vec<Range<u64>>,
    /// Those with unwind info, to tell where unwinding left it.
    covered: Vec<Range<u64>>,
    /// The files its modules were read from.
    files: Vec<FileId>,
}

/// Unwind info kept for binaries no live process maps, the most recently
/// used first: a churn of short processes runs the same few again and
/// again, while a busy host (a build: every build script is a new binary,
/// rustc's library has megabytes of .eh_frame) runs ever new ones. Bounded
/// by bytes as well as by count, or the spare set alone grew past 100 MiB.
const SPARE_OBJECTS: usize = 64;
const SPARE_OBJECT_BYTES: usize = 32 << 20;

/// A file's unwind info (None if it could not be read), and when it was
/// last used to build a process's unwinder.
struct Held {
    info: Option<Arc<ObjectInfo>>,
    used: u64,
}

#[derive(Default)]
pub struct DwarfUnwinder {
    /// By (device, inode).
    objects: HashMap<FileId, Held>,
    /// Ticks once per unwinder built: the recency of `objects`.
    clock: u64,
    procs: HashMap<u32, Proc>,
    cache: ArchCache,
    pub stats: UnwindStats,
}

impl DwarfUnwinder {
    fn build(&mut self, pid: u32, maps: &MapsCache) -> Option<Proc> {
        let mut unwinder = ArchUnwinder::new();
        let mut covered = Vec::new();
        let mut exec = Vec::new();
        let mut files = Vec::new();
        self.clock += 1;
        for m in maps.maps(pid)? {
            if !m.perms.contains('x') {
                continue;
            }
            exec.push(m.start..m.end);
            if !m.path.starts_with('/') {
                continue;
            }
            let o = self
                .objects
                .entry((m.dev, m.inode))
                .or_insert_with(|| Held {
                    info: maps
                        .file(m)
                        .and_then(|f| ObjectInfo::read(&f))
                        .map(Arc::new),
                    used: 0,
                });
            o.used = self.clock;
            let info = o.info.clone();
            let Some(info) = info else { continue };
            files.push((m.dev, m.inode));
            let Some(bias) = info.bias(m) else { continue };
            if info.has_unwind_info() {
                covered.push(m.start..m.end);
            }
            let (eh_frame_svma, eh_frame) = split(info.eh_frame.clone());
            let (eh_frame_hdr_svma, eh_frame_hdr) = split(info.eh_frame_hdr.clone());
            let sections = ExplicitModuleSectionInfo {
                base_svma: 0,
                text_svma: info.text.clone(),
                eh_frame_svma,
                eh_frame,
                eh_frame_hdr_svma,
                eh_frame_hdr,
                debug_frame: info.debug_frame.clone(),
                ..Default::default()
            };
            unwinder.add_module(Module::new(
                m.path.to_string(),
                m.start..m.end,
                bias,
                sections,
            ));
        }
        Some(Proc {
            unwinder,
            exec,
            covered,
            files,
        })
    }

    /// Lets go of the modules of processes that exited, and of the unwind
    /// info only they used, past the spare bounds (least recently used
    /// first).
    pub fn forget_exited(&mut self, alive: impl Fn(u32) -> bool) {
        self.procs.retain(|p, _| alive(*p));
        let live: std::collections::HashSet<FileId> = self
            .procs
            .values()
            .flat_map(|p| p.files.iter().copied())
            .collect();
        let mut spare: Vec<(u64, FileId, usize)> = self
            .objects
            .iter()
            .filter(|(k, _)| !live.contains(k))
            .map(|(k, o)| (o.used, *k, o.info.as_ref().map_or(0, |i| i.bytes())))
            .collect();
        spare.sort_unstable_by_key(|s| std::cmp::Reverse(s.0));
        let mut bytes = 0;
        for (n, (_, k, size)) in spare.into_iter().enumerate() {
            bytes += size;
            if n >= SPARE_OBJECTS || bytes > SPARE_OBJECT_BYTES {
                self.objects.remove(&k);
            }
        }
    }

    /// Files whose unwind info is held, and its bytes.
    pub fn held(&self) -> (usize, usize) {
        let bytes = self
            .objects
            .values()
            .filter_map(|o| o.info.as_ref())
            .map(|i| i.bytes())
            .sum();
        (self.objects.len(), bytes)
    }

    /// Unwinds one `kind::STACK_SAMPLE` record of `pid`: addresses for
    /// symbolization (return addresses minus one), innermost first.
    pub fn unwind(
        &mut self,
        maps: &mut MapsCache,
        s: &StackSample,
        stack: &[u8],
    ) -> (Vec<u64>, End) {
        let (frames, end) = self.walk(maps, s, stack);
        self.stats.count(end);
        (frames, end)
    }

    fn walk(&mut self, maps: &mut MapsCache, s: &StackSample, stack: &[u8]) -> (Vec<u64>, End) {
        let pid = s.tgid;
        // New process, or code mapped since the last look (dlopen, exec).
        let stale = self
            .procs
            .get(&pid)
            .is_none_or(|p| !p.exec.iter().any(|r| r.contains(&s.ip)));
        // A gone process cannot be read again, but its last copy (read at
        // its exit) may hold what the one built from lacked: samples drained
        // after a short-lived process exited (a loaded host) found libc
        // missing from an unwinder built at its exec, and stopped at __brk.
        let rebuild = stale
            && (maps.snapshot(pid)
                || !self.procs.contains_key(&pid)
                || maps.maps(pid).is_some_and(|ms| {
                    ms.iter()
                        .any(|m| m.perms.contains('x') && m.start <= s.ip && s.ip < m.end)
                }));
        if rebuild {
            match self.build(pid, maps) {
                Some(p) => {
                    self.procs.insert(pid, p);
                }
                None => return (vec![s.ip], End::NoMaps),
            }
        }
        let proc = self.procs.get(&pid).expect("built above");
        let (sp, skip) = (s.sp, s.skip as usize);
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let off = addr.checked_sub(sp).ok_or(())? as usize;
            if off < skip {
                return Err(());
            }
            let b = stack.get(off..off + 8).ok_or(())?;
            Ok(u64::from_le_bytes(b.try_into().unwrap()))
        };
        let regs = regs_of(s);
        let mut it = proc
            .unwinder
            .iter_frames(s.ip, regs, &mut self.cache, &mut read_stack);
        let mut frames = Vec::new();
        let mut end = End::Complete;
        loop {
            match it.next() {
                Ok(Some(f)) => {
                    let a = match f {
                        FrameAddress::InstructionPointer(ip) => ip,
                        FrameAddress::ReturnAddress(ra) => ra.get().saturating_sub(1),
                    };
                    if !proc.covered.iter().any(|r| r.contains(&a)) {
                        end = End::NoUnwindInfo;
                    }
                    frames.push(a);
                    if frames.len() >= MAX_FRAMES {
                        break;
                    }
                }
                Ok(None) => break,
                Err(UnwindError::CouldNotReadStack(a)) if a >= sp + stack.len() as u64 => {
                    end = End::Truncated;
                    break;
                }
                // A null return address marks the outermost frame.
                Err(UnwindError::ReturnAddressIsNull) => break,
                // framehop walks frame pointers only where a frame has no
                // CFI (hand-written entry code such as ld.so's _start).
                Err(UnwindError::FramepointerUnwindingMovedBackwards) => {
                    end = End::NoUnwindInfo;
                    break;
                }
                Err(_) => {
                    if end == End::Complete {
                        end = End::Failed;
                    }
                    break;
                }
            }
        }
        // Kept as a key for the rest of the run, up to 65,536 of them:
        // without the doubling's spare room, half the bytes.
        frames.shrink_to_fit();
        (frames, end)
    }
}

fn split(s: Option<(Range<u64>, Data)>) -> (Option<Range<u64>>, Option<Data>) {
    match s {
        Some((r, d)) => (Some(r), Some(d)),
        None => (None, None),
    }
}
