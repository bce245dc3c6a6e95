//! `uprobe_multi` links: one program at many points of one object, as a
//! plain uprobe (`BPF_TRACE_UPROBE_MULTI`, Linux 6.6) or as a session, at
//! a function's entry and at its return, whose result at entry tells the
//! kernel whether to run it at the return too (`BPF_TRACE_UPROBE_SESSION`,
//! Linux 6.13). aya 0.14 neither loads a program with those expected
//! attach types nor makes `uprobe_multi` links, so this does both: the program's instructions come from the embedded
//! object, relocated against the maps aya already created (so both share
//! every map), then `BPF_PROG_LOAD` and `BPF_LINK_CREATE`, as libbpf does.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use aya::maps::{Map, MapData};
use aya::Ebpf;

use super::attach::Method;
use super::why::WayError;

use crate::kernel::bpfsys::{
    call_fd, BtfLoad, ProgLoad, BPF_BTF_LOAD, BPF_LINK_CREATE, BPF_PROG_LOAD,
};

const BPF_PROG_TYPE_KPROBE: u32 = 2;

/// The kinds of `uprobe_multi` link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Plain,
    Session,
}

impl Kind {
    pub fn of(m: Method) -> Option<Kind> {
        match m {
            Method::UprobeMulti => Some(Kind::Plain),
            Method::UprobeSession => Some(Kind::Session),
            _ => None,
        }
    }

    /// `enum bpf_attach_type` (uapi, fixed once released).
    fn attach_type(self) -> u32 {
        match self {
            Kind::Plain => 48,
            Kind::Session => 57,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Plain => "uprobe_multi",
            Kind::Session => "uprobe session",
        }
    }
}

/// `union bpf_attr`'s `link_create` with its `uprobe_multi` member.
#[repr(C)]
#[derive(Default)]
struct LinkCreate {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    _pad: u32,
}

fn map_data(m: &Map) -> &MapData {
    match m {
        Map::Array(d)
        | Map::ArrayOfMaps(d)
        | Map::BloomFilter(d)
        | Map::CgroupArray(d)
        | Map::CgroupStorage(d)
        | Map::CgrpStorage(d)
        | Map::CpuMap(d)
        | Map::DevMap(d)
        | Map::DevMapHash(d)
        | Map::HashMap(d)
        | Map::HashOfMaps(d)
        | Map::InodeStorage(d)
        | Map::LpmTrie(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuCgroupStorage(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::PerfEventArray(d)
        | Map::ProgramArray(d)
        | Map::Queue(d)
        | Map::ReusePortSockArray(d)
        | Map::RingBuf(d)
        | Map::SockHash(d)
        | Map::SockMap(d)
        | Map::SkStorage(d)
        | Map::Stack(d)
        | Map::StackTraceMap(d)
        | Map::Unsupported(d)
        | Map::XskMap(d) => d,
    }
}

/// Loads program `name` of the embedded object for a `kind` link, sharing
/// `bpf`'s maps.
pub fn load_prog(bpf: &Ebpf, name: &str, kind: Kind) -> Result<OwnedFd, WayError> {
    let failed = |e: &dyn std::error::Error| WayError::Failed(super::chain(e));
    let mut obj = aya_obj::Object::parse(super::loader::object()).map_err(|e| failed(&e))?;
    // The object's BTF, for the functions' info: without it the kernel
    // refuses a callback (bpf_loop's frame step). Kernels with these links
    // (6.6) have every BTF feature.
    let features = aya_obj::btf::BtfFeatures::new(true, true, true, true, true, true, true, true);
    let btf = match obj.fixup_and_sanitize_btf(&features) {
        Ok(Some(btf)) => {
            let bytes = btf.to_bytes();
            let attr = BtfLoad {
                btf: bytes.as_ptr() as u64,
                btf_size: bytes.len() as u32,
                ..Default::default()
            };
            // SAFETY: `bytes` is live and `btf_size` long; no log is asked.
            let fd = unsafe { call_fd(BPF_BTF_LOAD, &attr) };
            Some(fd.map_err(|e| WayError::Failed(format!("BPF_BTF_LOAD: {e}")))?)
        }
        _ => None,
    };
    let maps: Vec<(String, aya_obj::Map)> = obj.maps.drain().collect();
    let fds: Vec<(&str, i32, &aya_obj::Map)> = maps
        .iter()
        .filter_map(|(n, m)| {
            let fd = map_data(bpf.map(n)?).fd().as_fd().as_raw_fd();
            Some((n.as_str(), fd, m))
        })
        .collect();
    let text = obj.functions.keys().map(|(sec, _)| *sec).collect();
    obj.relocate_maps(fds.into_iter(), &text)
        .map_err(|e| failed(&e))?;
    obj.relocate_calls(&text).map_err(|e| failed(&e))?;
    let prog = obj
        .programs
        .get(name)
        .ok_or_else(|| WayError::Failed(format!("program {name} missing from the object")))?;
    let f = &obj.functions[&prog.function_key()];
    let insns = &f.instructions;
    let license = c"GPL";
    let mut attr = ProgLoad {
        prog_type: BPF_PROG_TYPE_KPROBE,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        expected_attach_type: kind.attach_type(),
        ..Default::default()
    };
    if let Some(btf) = &btf {
        attr.prog_btf_fd = btf.as_raw_fd() as u32;
        attr.func_info_rec_size = f.func_info_rec_size as u32;
        attr.func_info = f.func_info.func_info.as_ptr() as u64;
        attr.func_info_cnt = f.func_info.func_info.len() as u32;
    }
    let n = name.len().min(15);
    attr.prog_name[..n].copy_from_slice(&name.as_bytes()[..n]);
    // SAFETY: the instructions, license, name and func_info the attribute
    // points at live until the function returns.
    unsafe { call_fd(BPF_PROG_LOAD, &attr) }.or_else(|e| {
        // Again with the verifier's log, for its last words.
        // Large enough for the whole log of a refused program (a cut one
        // ends mid-way, not with the reason).
        let mut log = vec![0u8; 1 << 24];
        attr.log_level = 1;
        attr.log_size = log.len() as u32;
        attr.log_buf = log.as_mut_ptr() as u64;
        // SAFETY: as above, and the log buffer is `log_size` bytes.
        let again = unsafe { call_fd(BPF_PROG_LOAD, &attr) };
        let text = String::from_utf8_lossy(&log);
        match again {
            Ok(fd) => Ok(fd),
            Err(_) => Err(WayError::Refused {
                what: format!(
                    "the kernel refused the program (BPF_PROG_LOAD for {}: {e})",
                    kind.name()
                ),
                log: Some(text.trim_end_matches('\0').to_string()),
            }),
        }
    })
}

/// Attaches `prog` (loaded for `kind`) at file offsets `points` (each with
/// its cookie) of `path`, for process `pid` or every process.
pub fn attach(
    prog: &OwnedFd,
    kind: Kind,
    path: &str,
    points: &[(u64, u64)],
    pid: Option<u32>,
) -> Result<OwnedFd, WayError> {
    let cpath = CString::new(path).map_err(|e| WayError::Failed(e.to_string()))?;
    let offsets: Vec<u64> = points.iter().map(|p| p.0).collect();
    let cookies: Vec<u64> = points.iter().map(|p| p.1).collect();
    let attr = LinkCreate {
        prog_fd: prog.as_raw_fd() as u32,
        attach_type: kind.attach_type(),
        path: cpath.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        cookies: cookies.as_ptr() as u64,
        cnt: points.len() as u32,
        pid: pid.unwrap_or(0),
        ..Default::default()
    };
    // SAFETY: the path, offsets and cookies are live for the call and
    // `cnt` long.
    unsafe { call_fd(BPF_LINK_CREATE, &attr) }
        .map_err(|e| WayError::Failed(format!("BPF_LINK_CREATE ({}): {e}", kind.name())))
}
