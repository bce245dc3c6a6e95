//! A tracing session: load the embedded object with its globals, attach each
//! probe through its fallback chain, drain the ring buffer, and end cleanly.

use std::collections::HashSet;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::Path;

use aya::{
    maps::{
        Array, HashMap as AyaHashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf, StackTraceMap,
    },
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        BtfTracePoint, FEntry, KProbe, PerfEvent, RawTracePoint, TracePoint,
    },
    util::online_cpus,
    Btf, Ebpf, EbpfLoader, Pod,
};
use memtrace_common::{
    loss,
    stacks::{UserStack, USTACK_IN_SAMPLE, USTACK_NOT_SAMPLED},
};

use crate::attach::{Method, Probe, Target, Way};
use crate::error::{Error, Result};
use crate::symbolize::Symbolizer;
use crate::unwind::DwarfStacks;

/// The compiled kernel programs, embedded at build time.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memtrace.obj"));

/// Globals and map sizes to apply when the object is loaded.
#[derive(Default)]
pub struct Loader {
    globals: Vec<(&'static str, Vec<u8>)>,
    sizes: Vec<(&'static str, u32)>,
}

impl Loader {
    pub fn global<T: Pod>(&mut self, name: &'static str, v: &T) -> &mut Self {
        // SAFETY: T is Pod: any byte pattern of it may be read.
        let bytes = unsafe {
            std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>())
        };
        self.globals.retain(|(n, _)| *n != name);
        self.globals.push((name, bytes.to_vec()));
        self
    }

    /// The names of the globals set so far.
    pub fn global_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.globals.iter().map(|(n, _)| *n)
    }

    /// The size set for `map`, if any.
    pub fn size_of(&self, map: &str) -> Option<u32> {
        self.sizes.iter().find(|(m, _)| *m == map).map(|(_, n)| *n)
    }

    pub fn max_entries(&mut self, map: &'static str, n: u32) -> &mut Self {
        self.sizes.retain(|(m, _)| *m != map);
        self.sizes.push((map, n));
        self
    }
}

/// BPF_MAP_LOOKUP_AND_DELETE_ELEM on a per-CPU hash map (aya does not
/// expose it for hash maps): the key's value on each possible CPU, or None
/// when the key is gone.
fn take_percpu<K: Pod, V: Pod>(fd: RawFd, key: &K, cpus: usize) -> std::io::Result<Option<Vec<V>>> {
    #[repr(C)]
    struct ElemAttr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }
    const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;
    // Per-CPU values come 8-byte aligned, one per possible CPU.
    let stride = std::mem::size_of::<V>().div_ceil(8) * 8;
    let mut buf = vec![0u64; stride / 8 * cpus];
    let attr = ElemAttr {
        map_fd: fd as u32,
        _pad: 0,
        key: key as *const K as u64,
        value: buf.as_mut_ptr() as u64,
        flags: 0,
    };
    // SAFETY: attr points at a live key and a buffer of the size the
    // kernel writes for this map.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_LOOKUP_AND_DELETE_ELEM,
            &attr as *const ElemAttr,
            std::mem::size_of::<ElemAttr>(),
        )
    };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            _ => Err(e),
        };
    }
    let bytes = buf.as_ptr() as *const u8;
    Ok(Some(
        (0..cpus)
            // SAFETY: V is Pod and each read is within buf.
            .map(|c| unsafe { std::ptr::read_unaligned(bytes.add(c * stride) as *const V) })
            .collect(),
    ))
}

/// Maps every tool would otherwise pay for; a tool raises the ones it uses.
const SHRINKABLE: [&str; 19] = [
    "STACKS",
    "EXEC_NAMES",
    "FAULT_SLOTS",
    "FAULT_SLOT_FREE",
    "USTACKS",
    "FAULTS",
    "FAULTS_PERF",
    "FILE_FAULTS",
    "FILES_SEEN",
    "BRK_STACKS",
    "SWAPINS",
    "RECLAIM_START",
    "SLAB_START",
    "PROC_RECLAIM",
    "FOLLOWED",
    "RSS",
    "RSS_OWNER",
    "RSS_EXCLUDED",
    "SNOOP_PENDING",
];

pub struct Session {
    pub bpf: Ebpf,
    btf: Option<Btf>,
    forced: Option<Method>,
    verbose: bool,
    loaded: HashSet<&'static str>,
    /// (probe, method, target) for each probe attached.
    pub attached: Vec<(String, String, String)>,
    pub sym: Symbolizer,
    /// `--stack-mode dwarf`: the unwinder and the unwound samples.
    pub dwarf: Option<DwarfStacks>,
    /// User stack ids name USTACKS entries (walked in the program), not STACKS.
    pub walked_user_stacks: bool,
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let cs = c.to_string();
        if !s.contains(&cs) {
            s.push_str(": ");
            s.push_str(&cs);
        }
        cur = c.source();
    }
    s
}

/// aya's `EbpfLoader::new` parses all of vmlinux BTF (a third of start-up
/// time and most of the peak memory), though memtrace resolves its offsets
/// itself and needs kernel BTF only for tp_btf and fentry (parsed then, in
/// `Session::btf`). So the loader is made in a thread whose own mount
/// namespace hides `/sys/kernel/btf`. Where that is not allowed, it pays.
fn loader_without_kernel_btf() -> EbpfLoader<'static> {
    std::thread::spawn(|| {
        if let Err(e) = hide_kernel_btf() {
            if std::env::var_os("MEMTRACE_TIMING").is_some() {
                eprintln!("memtrace: timing: kernel BTF not hidden from aya: {e}");
            }
        }
        EbpfLoader::new()
    })
    .join()
    .unwrap_or_else(|_| EbpfLoader::new())
}

/// Only the calling thread changes namespace; the host's mounts are untouched.
fn hide_kernel_btf() -> std::io::Result<()> {
    let check = |r: libc::c_int| {
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: plain syscalls on constant C strings.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS))?;
        // Private first: otherwise the mount below would propagate back.
        check(libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ))?;
        check(libc::mount(
            c"none".as_ptr(),
            c"/sys/kernel/btf".as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_RDONLY,
            std::ptr::null(),
        ))
    }
}

impl Session {
    pub fn load(spec: &Loader, forced: Option<Method>, verbose: bool) -> Result<Session> {
        raise_memlock();
        let mut loader = loader_without_kernel_btf();
        // Unused maps cost locked kernel memory; keep them tiny unless asked for.
        for m in SHRINKABLE {
            if !spec.sizes.iter().any(|(n, _)| *n == m) {
                loader.map_max_entries(m, 1);
            }
        }
        for (m, n) in &spec.sizes {
            loader.map_max_entries(m, *n);
        }
        for (name, bytes) in &spec.globals {
            loader.override_global(name, bytes.as_slice(), true);
        }
        let bpf = loader.load(OBJECT).map_err(|e| Error::Load(chain(&e)))?;
        Ok(Session {
            bpf,
            btf: None,
            forced,
            verbose,
            loaded: HashSet::new(),
            attached: Vec::new(),
            sym: Symbolizer::new(),
            dwarf: None,
            walked_user_stacks: false,
        })
    }

    fn btf(&mut self) -> std::result::Result<&Btf, String> {
        if self.btf.is_none() {
            self.btf = Some(Btf::from_sys_fs().map_err(|e| format!("no kernel BTF: {e}"))?);
        }
        Ok(self.btf.as_ref().unwrap())
    }

    /// Attaches `probe` by the first of its ways that works here. Returns the
    /// way used, or `None` for an optional probe nothing could attach.
    pub fn attach(&mut self, probe: &Probe) -> Result<Option<Way>> {
        match self.first_way(probe) {
            Ok(way) => Ok(Some(way)),
            Err(reasons) if probe.required => Err(Error::Unsupported {
                what: probe.what.to_string(),
                reasons,
            }),
            Err(reasons) => {
                eprintln!("memtrace: warning: {} not traced: {reasons}", probe.what);
                Ok(None)
            }
        }
    }

    /// The way that attached, or every way's reason for failing.
    pub fn first_way(&mut self, probe: &Probe) -> std::result::Result<Way, String> {
        let mut reasons = Vec::new();
        let candidates: Vec<Way> = probe.candidates(self.forced).into_iter().cloned().collect();
        if candidates.is_empty() {
            let m = self.forced.map(|m| m.name()).unwrap_or("?");
            reasons.push(format!("it cannot be attached by {m} (forced by --attach)"));
        }
        for way in candidates {
            match self.try_way(&way) {
                Ok(()) => {
                    if self.verbose {
                        eprintln!(
                            "memtrace: {}: attached {} {}",
                            probe.what, way.method, way.target
                        );
                    }
                    self.attached.push((
                        probe.what.to_string(),
                        way.method.name().to_string(),
                        way.target.to_string(),
                    ));
                    return Ok(way);
                }
                Err(why) => {
                    if self.verbose {
                        eprintln!(
                            "memtrace: {}: {} {} failed: {why}",
                            probe.what, way.method, way.target
                        );
                    }
                    reasons.push(format!("{} {}: {why}", way.method, way.target));
                }
            }
        }
        Err(reasons.join("; "))
    }

    fn try_way(&mut self, way: &Way) -> std::result::Result<(), String> {
        precheck(way)?;
        let first = self.loaded.insert(way.prog);
        let btf = match way.method {
            Method::Fentry | Method::TpBtf if first => Some(self.btf()?.clone()),
            _ => None,
        };
        let prog = self
            .bpf
            .program_mut(way.prog)
            .ok_or_else(|| format!("program {} missing from the object", way.prog))?;
        let e = |e: &dyn std::error::Error| chain(e);
        let res: std::result::Result<(), String> = (|| {
            match (way.method, &way.target) {
                (Method::Kprobe, Target::Func(f)) => {
                    let p: &mut KProbe = prog.try_into().map_err(|x| e(&x))?;
                    if first {
                        p.load().map_err(|x| e(&x))?;
                    }
                    p.attach(f, 0).map_err(|x| e(&x))?;
                }
                (Method::Fentry, Target::Func(f)) => {
                    let p: &mut FEntry = prog.try_into().map_err(|x| e(&x))?;
                    if let Some(btf) = &btf {
                        p.load(f, btf).map_err(|x| e(&x))?;
                    }
                    p.attach().map_err(|x| e(&x))?;
                }
                (Method::TpBtf, Target::Tp(_, n)) => {
                    let p: &mut BtfTracePoint = prog.try_into().map_err(|x| e(&x))?;
                    if let Some(btf) = &btf {
                        p.load(n, btf).map_err(|x| e(&x))?;
                    }
                    p.attach().map_err(|x| e(&x))?;
                }
                (Method::RawTp, Target::Tp(_, n)) => {
                    let p: &mut RawTracePoint = prog.try_into().map_err(|x| e(&x))?;
                    if first {
                        p.load().map_err(|x| e(&x))?;
                    }
                    p.attach(n).map_err(|x| e(&x))?;
                }
                (Method::Tracepoint, Target::Tp(c, n)) => {
                    let p: &mut TracePoint = prog.try_into().map_err(|x| e(&x))?;
                    if first {
                        p.load().map_err(|x| e(&x))?;
                    }
                    p.attach(c, n).map_err(|x| e(&x))?;
                }
                (Method::Perf, Target::PageFaults) => {
                    let p: &mut PerfEvent = prog.try_into().map_err(|x| e(&x))?;
                    if first {
                        p.load().map_err(|x| e(&x))?;
                    }
                    let cpus = online_cpus().map_err(|(_, x)| x.to_string())?;
                    for cpu in cpus {
                        p.attach(
                            PerfEventConfig::Software(SoftwareEvent::PageFaults),
                            PerfEventScope::AllProcessesOneCpu { cpu },
                            SamplePolicy::Period(1),
                            true,
                        )
                        .map_err(|x| e(&x))?;
                    }
                }
                _ => return Err("method does not fit target".into()),
            }
            Ok(())
        })();
        if res.is_err() && first {
            // A failed load leaves nothing loaded; let another way retry.
            self.loaded.remove(way.prog);
        }
        res.map_err(|m| explain(way, m))
    }

    /// Takes the ring buffer for asynchronous draining.
    pub fn ring_buffer(&mut self) -> Result<RingBuf<MapData>> {
        let m = self
            .bpf
            .take_map("EVENTS")
            .ok_or_else(|| Error::Runtime("EVENTS map missing".into()))?;
        RingBuf::try_from(m).map_err(|e| Error::Runtime(chain(&e)))
    }

    /// Every key of per-CPU hash map `name` with its per-CPU values. With
    /// `clear`, the keys read are deleted (interval reports start afresh).
    pub fn read_percpu<K: Pod, V: Pod>(
        &mut self,
        name: &str,
        clear: bool,
    ) -> Result<Vec<(K, Vec<V>)>> {
        let map = self
            .bpf
            .map(name)
            .ok_or_else(|| Error::Runtime(format!("{name} map missing")))?;
        let m: PerCpuHashMap<_, K, V> =
            PerCpuHashMap::try_from(map).map_err(|e| Error::Runtime(chain(&e)))?;
        if !clear {
            return Ok(m
                .iter()
                .filter_map(|item| item.ok())
                .map(|(k, vals)| (k, vals.iter().copied().collect()))
                .collect());
        }
        // Each key read and deleted in one call: reading them all, then
        // deleting, lost every add made in between (a millisecond with
        // a thousand keys).
        let keys: Vec<K> = m.keys().filter_map(|k| k.ok()).collect();
        let fd = match self.bpf.map(name) {
            Some(aya::maps::Map::PerCpuHashMap(d)) => Some(d.fd().as_fd().as_raw_fd()),
            _ => None,
        };
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| Error::Runtime(e.to_string()))?;
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            match fd.map(|fd| take_percpu::<K, V>(fd, &k, cpus)) {
                Some(Ok(Some(vals))) => out.push((k, vals)),
                Some(Ok(None)) => {}
                // Kernels before 5.14: read, then delete.
                _ => {
                    let map = self.bpf.map_mut(name).expect("map seen above");
                    let mut m: PerCpuHashMap<_, K, V> =
                        PerCpuHashMap::try_from(map).map_err(|e| Error::Runtime(chain(&e)))?;
                    if let Ok(vals) = m.get(&k, 0) {
                        out.push((k, vals.iter().copied().collect()));
                    }
                    let _ = m.remove(&k);
                }
            }
        }
        Ok(out)
    }

    /// Every slot of a per-CPU array, with its values on each CPU.
    pub fn read_percpu_array<V: Pod>(&self, name: &str) -> Result<Vec<Vec<V>>> {
        let map = self
            .bpf
            .map(name)
            .ok_or_else(|| Error::Runtime(format!("{name} map missing")))?;
        let arr: PerCpuArray<_, V> =
            PerCpuArray::try_from(map).map_err(|e| Error::Runtime(chain(&e)))?;
        (0..arr.len())
            .map(|i| {
                arr.get(&i, 0)
                    .map(|v| v.iter().copied().collect())
                    .map_err(|e| Error::Runtime(chain(&e)))
            })
            .collect()
    }

    /// Sets slot `i` of array `name`.
    pub fn set_array<V: Pod>(&mut self, name: &str, i: u32, v: V) -> Result<()> {
        let map = self
            .bpf
            .map_mut(name)
            .ok_or_else(|| Error::Runtime(format!("{name} map missing")))?;
        let mut arr: Array<_, V> = Array::try_from(map).map_err(|e| Error::Runtime(chain(&e)))?;
        arr.set(i, v, 0).map_err(|e| Error::Runtime(chain(&e)))
    }

    /// Events lost in the kernel so far, by reason, summed over CPUs.
    pub fn losses(&self) -> Vec<(&'static str, u64)> {
        let mut out: Vec<(&'static str, u64)> = loss::NAMES.iter().map(|n| (*n, 0)).collect();
        if let Some(m) = self.bpf.map("LOSSES") {
            if let Ok(arr) = PerCpuArray::<_, u64>::try_from(m) {
                for (i, slot) in out.iter_mut().enumerate() {
                    if let Ok(vals) = arr.get(&(i as u32), 0) {
                        slot.1 = vals.iter().sum();
                    }
                }
            }
        }
        out
    }

    /// Instruction pointers of stack `id`, innermost first.
    pub fn stack(&self, id: i32) -> Option<Vec<u64>> {
        if id < 0 {
            return None;
        }
        let m = self.bpf.map("STACKS")?;
        let st = StackTraceMap::try_from(m).ok()?;
        let trace = st.get(&(id as u32), 0).ok()?;
        Some(trace.frames().iter().map(|f| f.ip).collect())
    }

    /// Instruction pointers of user stack `id`, innermost first.
    pub fn user_stack(&self, id: i32) -> Option<Vec<u64>> {
        if !self.walked_user_stacks {
            return self.stack(id);
        }
        if id < 0 {
            return None;
        }
        let m = AyaHashMap::<_, u32, UserStack>::try_from(self.bpf.map("USTACKS")?).ok()?;
        let s = m.get(&(id as u32), 0).ok()?;
        Some(s.ips[..(s.nr as usize).min(s.ips.len())].to_vec())
    }

    /// Symbolized user stack `id` of `pid`, or why there is none.
    pub fn user_frames(&mut self, pid: u32, id: i32) -> Vec<String> {
        self.thread_user_frames(pid, None, id)
    }

    /// The same, where the record names its thread: in dwarf mode the stack
    /// is the one that thread copied just before.
    pub fn thread_user_frames(&mut self, pid: u32, tid: Option<u32>, id: i32) -> Vec<String> {
        if id == USTACK_NOT_SAMPLED {
            return vec!["[not sampled (--sample)]".into()];
        }
        if id == USTACK_IN_SAMPLE {
            let Some((ips, end)) = self.dwarf.as_mut().and_then(|d| d.take_last(pid, tid)) else {
                return vec!["[copied stack not received (counted in ringbuf_full)]".into()];
            };
            let mut frames = self.sym.user(pid, &ips);
            frames.extend(end.note().map(|n| format!("[{n}]")));
            return frames;
        }
        match self.user_stack(id) {
            Some(ips) => self.sym.user(pid, &ips),
            None => Vec::new(),
        }
    }

    pub fn kernel_frames(&mut self, id: i32) -> Vec<String> {
        match self.stack(id) {
            Some(ips) => self.sym.kernel(&ips),
            None => Vec::new(),
        }
    }
}

/// Cheap checks that give a clearer reason than the load error would.
fn precheck(way: &Way) -> std::result::Result<(), String> {
    match (way.method, &way.target) {
        (Method::Kprobe, _) if !Path::new("/sys/bus/event_source/devices/kprobe/type").exists() => {
            Err("the kernel has no kprobes (CONFIG_KPROBES is off)".into())
        }
        (Method::Tracepoint, Target::Tp(c, n)) if !crate::kernel::tracefs::exists(c, n) => {
            Err("no such tracepoint on this kernel".into())
        }
        (Method::Fentry, Target::Func(f)) => {
            let btf = crate::kernel::KernelBtf::shared().map_err(|e| e.to_string())?;
            let id = btf
                .func_id(f)
                .ok_or_else(|| format!("no function {f} in kernel BTF"))?;
            crate::kernel::feature::fentry_loads(id)
                .map_err(|e| format!("the kernel refused to load an fentry program ({e})"))
        }
        _ => Ok(()),
    }
}

/// Puts the kernel's terse answers into words.
fn explain(way: &Way, msg: String) -> String {
    if way.method == Method::Fentry
        && (msg.contains("Operation not permitted") || msg.contains("EPERM"))
    {
        return format!("the kernel refused to load an fentry program ({msg})");
    }
    msg
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; newer ones use
/// the memory cgroup, so failing to raise it is only worth a note with -v.
fn raise_memlock() {
    let lim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid pointer.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
}
