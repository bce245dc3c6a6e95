//! Reading and writing the tools' maps: hash maps (per-CPU or shared) read
//! (and, for interval reports, deleted) key by key, per-CPU arrays, loss counters.

use std::os::fd::{AsFd, AsRawFd, RawFd};

use aya::maps::{Array, HashMap as AyaHashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf};
use aya::Pod;
use memtrace_common::names::MapName;
use memtrace_common::{
    faults::FaultVal, loss, names, reclaim::ProcReclaimVal, stacks::StackVal, TASK_COMM_LEN,
};

use super::{chain, Session};
use crate::error::{Error, Result};

/// Counters of events kept in a lesser form, not lost: a stack cut at the
/// walk's bound is reported (truncated), a fault counted while the count
/// map was full is reported without its process. Shown apart from losses.
pub const DEGRADATIONS: [&str; 4] = [
    "stack_truncated",
    "count_spilled",
    "tables_pending",
    "processes_uncounted",
];

pub fn is_degradation(reason: &str) -> bool {
    DEGRADATIONS.contains(&reason)
}

/// A hash map's descriptor, once aya's typed view of it has checked that its
/// keys and values are `K`'s and `V`'s sizes: `take` gives the kernel a
/// buffer sized by `V`, and the kernel writes the map's own size.
pub(super) struct KnownSizes<K, V>(RawFd, std::marker::PhantomData<(K, V)>);

impl<K: Pod, V: Pod> KnownSizes<K, V> {
    /// `m`'s descriptor if it is a hash map (per-CPU or not) of `K` to `V`.
    pub(super) fn of(m: &aya::maps::Map) -> Result<KnownSizes<K, V>> {
        use aya::maps::Map;
        let fd = match m {
            Map::HashMap(d) => {
                AyaHashMap::<_, K, V>::try_from(m).map_err(|e| Error::Runtime(chain(&e)))?;
                d.fd()
            }
            Map::PerCpuHashMap(d) => {
                PerCpuHashMap::<_, K, V>::try_from(m).map_err(|e| Error::Runtime(chain(&e)))?;
                d.fd()
            }
            _ => return Err(Error::Runtime("not a hash map".into())),
        };
        Ok(KnownSizes(fd.as_fd().as_raw_fd(), std::marker::PhantomData))
    }
}

/// BPF_MAP_LOOKUP_AND_DELETE_ELEM on a hash map (aya does not expose it
/// for hash maps): the key's value on each of `cpus` CPUs (1 for a map
/// that is not per-CPU), or None when the key is gone.
pub(super) fn take<K: Pod, V: Pod>(
    map: &KnownSizes<K, V>,
    key: &K,
    cpus: usize,
) -> std::io::Result<Option<Vec<V>>> {
    const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;
    // Per-CPU values come 8-byte aligned, one per possible CPU.
    let stride = std::mem::size_of::<V>().div_ceil(8) * 8;
    let mut buf = vec![0u64; stride / 8 * cpus];
    let attr = crate::kernel::bpfsys::ElemAttr {
        map_fd: map.0 as u32,
        _pad: 0,
        key: key as *const K as u64,
        value: buf.as_mut_ptr() as u64,
        flags: 0,
    };
    // SAFETY: attr points at a live key of the map's key size (`KnownSizes`)
    // and a buffer of what the kernel writes: the map's value size
    // (`KnownSizes` again), 8-byte aligned, per CPU.
    if let Err(e) = unsafe { crate::kernel::bpfsys::call(BPF_MAP_LOOKUP_AND_DELETE_ELEM, &attr) } {
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
impl Session {
    /// Takes the ring buffer for asynchronous draining.
    pub fn ring_buffer(&mut self) -> Result<RingBuf<MapData>> {
        let m = self
            .bpf
            .take_map(names::EVENTS.name)
            .ok_or_else(|| missing("EVENTS"))?;
        RingBuf::try_from(m).map_err(|e| Error::Runtime(chain(&e)))
    }

    fn map_data(&self, name: &'static str) -> Result<&aya::maps::Map> {
        self.bpf.map(name).ok_or_else(|| missing(name))
    }

    /// Whether `name` is a hash map whose values the CPUs share (one per
    /// key), not a per-CPU one: the readers below take either.
    fn shared(&self, name: &'static str) -> Result<bool> {
        Ok(matches!(self.map_data(name)?, aya::maps::Map::HashMap(_)))
    }

    /// Every key of a hash map with its per-CPU values (one value for a
    /// shared map). With `clear`, the keys read are deleted (interval
    /// reports start afresh).
    pub fn read_percpu<K: Pod, V: Pod>(
        &mut self,
        map: MapName<K, V>,
        clear: bool,
    ) -> Result<Vec<(K, Vec<V>)>> {
        if clear {
            // Each key read and deleted in one call: reading them all, then
            // deleting, lost every add made in between (a millisecond with
            // a thousand keys).
            let keys = self.percpu_keys(map)?;
            return self.take_percpu(map, &keys);
        }
        let data = self.map_data(map.name)?;
        if self.shared(map.name)? {
            let m = AyaHashMap::<_, K, V>::try_from(data).map_err(|e| Error::Runtime(chain(&e)))?;
            return Ok(m
                .iter()
                .filter_map(|item| self.counted(item))
                .map(|(k, v)| (k, vec![v]))
                .collect());
        }
        let m: PerCpuHashMap<_, K, V> =
            PerCpuHashMap::try_from(data).map_err(|e| Error::Runtime(chain(&e)))?;
        Ok(m.iter()
            .filter_map(|item| self.counted(item))
            .map(|(k, vals)| (k, vals.iter().copied().collect()))
            .collect())
    }

    /// Every key of a hash map, per-CPU or shared.
    pub fn percpu_keys<K: Pod, V: Pod>(&self, map: MapName<K, V>) -> Result<Vec<K>> {
        let data = self.map_data(map.name)?;
        if self.shared(map.name)? {
            let m = AyaHashMap::<_, K, V>::try_from(data).map_err(|e| Error::Runtime(chain(&e)))?;
            return Ok(m.keys().filter_map(|k| self.counted(k)).collect());
        }
        let m: PerCpuHashMap<_, K, V> =
            PerCpuHashMap::try_from(data).map_err(|e| Error::Runtime(chain(&e)))?;
        Ok(m.keys().filter_map(|k| self.counted(k)).collect())
    }

    /// Reads and deletes `keys` of a hash map, with their per-CPU values
    /// (one for a shared map); keys already gone are left out.
    pub fn take_percpu<K: Pod, V: Pod>(
        &mut self,
        map: MapName<K, V>,
        keys: &[K],
    ) -> Result<Vec<(K, Vec<V>)>> {
        let name = map.name;
        let shared = self.shared(name)?;
        let fd = match self.bpf.map(name) {
            Some(m @ (aya::maps::Map::PerCpuHashMap(_) | aya::maps::Map::HashMap(_))) => {
                Some(KnownSizes::<K, V>::of(m)?)
            }
            _ => None,
        };
        let cpus = match shared {
            true => 1,
            false => aya::util::nr_cpus().map_err(|(_, e)| Error::Runtime(e.to_string()))?,
        };
        let mut out = Vec::with_capacity(keys.len());
        for &k in keys {
            match fd.as_ref().map(|fd| take(fd, &k, cpus)) {
                Some(Ok(Some(vals))) => out.push((k, vals)),
                Some(Ok(None)) => {}
                // Kernels before 5.14: read, then delete.
                _ => {
                    let map = self.bpf.map_mut(name).expect("map seen above");
                    if shared {
                        let mut m = AyaHashMap::<_, K, V>::try_from(map)
                            .map_err(|e| Error::Runtime(chain(&e)))?;
                        if let Ok(v) = m.get(&k, 0) {
                            out.push((k, vec![v]));
                        }
                        let _ = m.remove(&k);
                        continue;
                    }
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

    /// `read_percpu` with each key's values folded over the CPUs.
    pub fn read_folded<K: Pod, V: Fold>(
        &mut self,
        map: MapName<K, V>,
        clear: bool,
    ) -> Result<Vec<(K, V)>> {
        Ok(self
            .read_percpu(map, clear)?
            .into_iter()
            .map(|(k, vals)| (k, V::fold(&vals)))
            .collect())
    }

    /// `take_percpu` with each key's values folded over the CPUs.
    pub fn take_folded<K: Pod, V: Fold>(
        &mut self,
        map: MapName<K, V>,
        keys: &[K],
    ) -> Result<Vec<(K, V)>> {
        Ok(self
            .take_percpu(map, keys)?
            .into_iter()
            .map(|(k, vals)| (k, V::fold(&vals)))
            .collect())
    }

    /// Every entry of a (non-per-CPU) hash map; empty when it is missing.
    pub fn hash_entries<K: Pod, V: Pod>(&self, map: MapName<K, V>) -> Vec<(K, V)> {
        let Ok(m) = self.map_data(map.name) else {
            return Vec::new();
        };
        let Ok(h) = AyaHashMap::<_, K, V>::try_from(m) else {
            return Vec::new();
        };
        h.iter().filter_map(|e| self.counted(e)).collect()
    }

    /// Every key of a (non-per-CPU) hash map; empty when it is missing.
    pub fn hash_keys<K: Pod, V: Pod>(&self, map: MapName<K, V>) -> Vec<K> {
        let Ok(m) = self.map_data(map.name) else {
            return Vec::new();
        };
        let Ok(h) = AyaHashMap::<_, K, V>::try_from(m) else {
            return Vec::new();
        };
        h.keys().filter_map(|k| self.counted(k)).collect()
    }

    /// One entry of a hash map.
    pub fn hash_get<K: Pod, V: Pod>(&self, map: MapName<K, V>, key: &K) -> Option<V> {
        let m = AyaHashMap::<_, K, V>::try_from(self.map_data(map.name).ok()?).ok()?;
        m.get(key, 0).ok()
    }

    /// Inserts into a hash map with BPF_* `flags`; an existing key with
    /// BPF_NOEXIST is not an error (the kernel's newer value stays).
    pub fn hash_insert<K: Pod, V: Pod>(
        &mut self,
        map: MapName<K, V>,
        key: K,
        v: V,
        flags: u64,
    ) -> Result<()> {
        let m = self
            .bpf
            .map_mut(map.name)
            .ok_or_else(|| missing(map.name))?;
        let mut h = AyaHashMap::<_, K, V>::try_from(m).map_err(|e| Error::Runtime(chain(&e)))?;
        match h.insert(key, v, flags) {
            Err(aya::maps::MapError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::EEXIST) =>
            {
                Ok(())
            }
            r => r.map_err(|e| Error::Runtime(chain(&e))),
        }
    }

    /// Every slot of a per-CPU array, with its values on each CPU.
    pub fn read_percpu_array<V: Pod>(&self, map: MapName<u32, V>) -> Result<Vec<Vec<V>>> {
        let arr: PerCpuArray<_, V> = PerCpuArray::try_from(self.map_data(map.name)?)
            .map_err(|e| Error::Runtime(chain(&e)))?;
        (0..arr.len())
            .map(|i| {
                arr.get(&i, 0)
                    .map(|v| v.iter().copied().collect())
                    .map_err(|e| Error::Runtime(chain(&e)))
            })
            .collect()
    }

    /// A descriptor of an array (for a process to map it).
    pub fn array_fd<V: Pod>(&self, map: MapName<u32, V>) -> Result<std::os::fd::OwnedFd> {
        let aya::maps::Map::Array(data) = self.map_data(map.name)? else {
            return Err(Error::Runtime(format!("{} is not an array", map.name)));
        };
        Ok(data.fd().as_fd().try_clone_to_owned()?)
    }

    /// Sets slot `i` of an array.
    pub fn set_array<V: Pod>(&mut self, map: MapName<u32, V>, i: u32, v: V) -> Result<()> {
        let m = self
            .bpf
            .map_mut(map.name)
            .ok_or_else(|| missing(map.name))?;
        let mut arr: Array<_, V> = Array::try_from(m).map_err(|e| Error::Runtime(chain(&e)))?;
        arr.set(i, v, 0).map_err(|e| Error::Runtime(chain(&e)))
    }

    /// Removes `key` from a (non-per-CPU) hash map; a key already gone is
    /// not an error.
    pub fn hash_remove<K: Pod, V: Pod>(&mut self, map: MapName<K, V>, key: &K) -> Result<()> {
        let m = self
            .bpf
            .map_mut(map.name)
            .ok_or_else(|| missing(map.name))?;
        let mut h = AyaHashMap::<_, K, V>::try_from(m).map_err(|e| Error::Runtime(chain(&e)))?;
        match h.remove(key) {
            Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(aya::maps::MapError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
            {
                Ok(())
            }
            r => r.map_err(|e| Error::Runtime(chain(&e))),
        }
    }

    /// The kernel's loss and degradation counters, by reason, summed over CPUs.
    fn loss_counters(&self) -> Vec<(&'static str, u64)> {
        if let Some((v, _)) = &self.counted_at_end {
            return v.clone();
        }
        let mut out: Vec<(&'static str, u64)> = loss::NAMES.iter().map(|n| (*n, 0)).collect();
        if let Ok(slots) = self.read_percpu_array(names::LOSSES) {
            for (slot, vals) in out.iter_mut().zip(slots) {
                slot.1 = vals.iter().sum();
            }
        }
        out
    }

    /// Takes the kernel's counters as the run ends, before the final report:
    /// what the programs meet while it is put together (seconds, for
    /// thousands of stacks) comes after the report's reads, and stacks are
    /// no longer taken out of the kernel meanwhile.
    pub fn end_counting(&mut self) {
        self.counted_at_end = Some((self.loss_counters(), self.missed_runs()));
    }

    /// Runs of memtrace's programs the kernel skipped (another BPF program
    /// ran on that CPU), up to the end of counting.
    fn skipped_runs(&self) -> u64 {
        match &self.counted_at_end {
            Some((_, m)) => *m,
            None => self.missed_runs(),
        }
    }

    /// Counts shown apart from the losses: with a process filter, the runs
    /// the kernel skipped anywhere on the host (before the filter could
    /// tell whose they were).
    pub fn apart(&self) -> Vec<(&'static str, u64)> {
        match self.filtered {
            true => vec![("host_missed_runs", self.skipped_runs())],
            false => Vec::new(),
        }
    }

    /// Events kept in a lesser form (`DEGRADATIONS`), by reason.
    pub fn degraded(&self) -> Vec<(&'static str, u64)> {
        let mut out = self.loss_counters();
        out.retain(|(r, _)| is_degradation(r));
        out
    }

    /// Events lost in the kernel so far, by reason, summed over CPUs.
    pub fn losses(&self) -> Vec<(&'static str, u64)> {
        let mut out = self.loss_counters();
        out.retain(|(r, _)| !is_degradation(r));
        if !self.filtered {
            out.push(("missed_runs", self.skipped_runs()));
        }
        out.push(("map_read_fail", self.read_fails.get()));
        out
    }
}

fn missing(name: &str) -> Error {
    Error::Runtime(format!("map {name} missing from the eBPF object"))
}

/// Per-CPU values folded into one: counts add up, names are the first
/// CPU's that has one.
pub trait Fold: Pod {
    fn fold(vals: &[Self]) -> Self;
}

impl Fold for u64 {
    fn fold(vals: &[u64]) -> u64 {
        vals.iter().sum()
    }
}

/// The first non-empty name among per-CPU copies.
pub fn first_name(names: impl Iterator<Item = [u8; TASK_COMM_LEN]>) -> [u8; TASK_COMM_LEN] {
    let mut names = names.peekable();
    let first = names.peek().copied().unwrap_or([0; TASK_COMM_LEN]);
    names.find(|n| n[0] != 0).unwrap_or(first)
}

impl Fold for FaultVal {
    fn fold(vals: &[Self]) -> Self {
        FaultVal {
            count: vals.iter().map(|v| v.count).sum(),
            memcg_id: vals
                .iter()
                .map(|v| v.memcg_id)
                .find(|&m| m != 0)
                .unwrap_or(0),
            comm: first_name(vals.iter().map(|v| v.comm)),
            ..Default::default()
        }
    }
}

impl Fold for StackVal {
    fn fold(vals: &[Self]) -> Self {
        StackVal {
            count: vals.iter().map(|v| v.count).sum(),
            bytes: vals.iter().map(|v| v.bytes).sum(),
            comm: first_name(vals.iter().map(|v| v.comm)),
            ..Default::default()
        }
    }
}

impl Fold for ProcReclaimVal {
    fn fold(vals: &[Self]) -> Self {
        ProcReclaimVal {
            ns: vals.iter().map(|v| v.ns).sum(),
            stalls: vals.iter().map(|v| v.stalls).sum(),
            pages: vals.iter().map(|v| v.pages).sum(),
            comm: first_name(vals.iter().map(|v| v.comm)),
        }
    }
}
