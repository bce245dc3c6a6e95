//! The capabilities memtrace needs, checked before anything is loaded:
//! CAP_BPF and CAP_PERFMON (load tracing programs, open tracepoint perf
//! events), or CAP_SYS_ADMIN, which covers both and is all that kernels
//! before 5.8 (no CAP_BPF) accept. Root has them all; a root shell whose
//! capabilities were dropped (a container, `setpriv`, systemd's
//! CapabilityBoundingSet) does not, whatever its uid says.

use crate::error::{Error, Result};

const CAP_SYS_RESOURCE: u32 = 24;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// capget/capset's header and data, _LINUX_CAPABILITY_VERSION_3: 64 bits
/// in two 32-bit words.
#[repr(C)]
struct Header {
    version: u32,
    pid: i32,
}
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}
const VERSION_3: u32 = 0x2008_0522;

/// The effective capability set of this process, as a bit mask.
fn effective() -> std::io::Result<u64> {
    let mut h = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: the header and two data words are what capget v3 reads and writes.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(d[0].effective as u64 | (d[1].effective as u64) << 32)
}

/// Gives up every capability but `keep` (effective, permitted,
/// inheritable, the bounding set) and sets no_new_privs: for a tool that
/// has loaded and attached everything and keeps only descriptors, before it
/// reads what a network client sends. The calling thread's: threads it
/// starts after inherit them.
pub fn drop_all_but(keep: u64) -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Needs CAP_SETPCAP, so before the rest; a capability this kernel
    // does not know is EINVAL, and nothing to drop.
    for c in (0..=last_cap()).filter(|c| keep & (1 << c) == 0) {
        // SAFETY: as above.
        unsafe { libc::prctl(libc::PR_CAPBSET_DROP, c as libc::c_ulong, 0, 0, 0) };
    }
    let mut h = Header {
        version: VERSION_3,
        pid: 0,
    };
    let word = |w: u32| Data {
        effective: w,
        permitted: w,
        inheritable: 0,
    };
    let d = [word(keep as u32), word((keep >> 32) as u32)];
    // SAFETY: the header and two data words are what capset v3 reads.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The user a daemon runs as once attached: `name` (or a number) from
/// /etc/passwd; `nobody` is 65534 where passwd lacks it.
pub fn user_ids(name: &str) -> Option<(u32, u32)> {
    if let Ok(uid) = name.parse::<u32>() {
        return Some((uid, uid));
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let found = passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() > 3 && f[0] == name).then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
    });
    found.or_else(|| (name == "nobody").then_some((65534, 65534)))
}

/// Becomes `uid`/`gid` (no supplementary groups), keeping no capability
/// but `keep`, with no_new_privs: a capability-less root still owns root's
/// files. glibc changes the ids of every thread; a capability kept is the
/// calling thread's.
pub fn become_user(uid: u32, gid: u32, keep: u64) -> std::io::Result<()> {
    let os = |r: libc::c_int| {
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: prctl and the id calls take integers; setgroups an empty list.
    unsafe {
        os(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        // Not open to the user's other processes (ptrace, /proc/PID/mem)
        // once it is theirs: its descriptors load and read BPF maps.
        os(libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0))?;
        for c in (0..=last_cap()).filter(|c| keep & (1 << c) == 0) {
            libc::prctl(libc::PR_CAPBSET_DROP, c as libc::c_ulong, 0, 0, 0);
        }
        if keep != 0 {
            os(libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0))?;
        }
        os(libc::setgroups(0, std::ptr::null()))?;
        os(libc::setresgid(gid, gid, gid))?;
        os(libc::setresuid(uid, uid, uid))?;
    }
    // What setresuid left (the permitted set with KEEPCAPS) narrowed to `keep`.
    drop_all_but(keep).or_else(|e| if keep == 0 { Ok(()) } else { Err(e) })?;
    // SAFETY: as above.
    if unsafe { libc::getuid() } != uid || effective()? != keep {
        return Err(std::io::Error::other(
            "the ids or capabilities did not change",
        ));
    }
    Ok(())
}

/// What reading maps by their descriptors still needs once loaded: nothing
/// since 6.5, but before it every bpf(2) call checks CAP_BPF (CAP_SYS_ADMIN
/// before 5.8) while `kernel.unprivileged_bpf_disabled` is set, as
/// distributions set it. With its name, for saying so.
pub fn kept_for_map_reads() -> Option<(u64, &'static str)> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let disabled = std::fs::read_to_string("/proc/sys/kernel/unprivileged_bpf_disabled")
        .is_ok_and(|s| s.trim() != "0");
    map_reads_need(&release, disabled, last_cap())
}

fn map_reads_need(release: &str, disabled: bool, last_cap: u32) -> Option<(u64, &'static str)> {
    let mut v = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>());
    let (Some(Ok(major)), Some(Ok(minor))) = (v.next(), v.next()) else {
        return None;
    };
    if !disabled || (major, minor) >= (6, 5) {
        return None;
    }
    Some(match last_cap >= CAP_BPF {
        true => (1 << CAP_BPF, "CAP_BPF"),
        false => (1 << CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
    })
}

/// Whether this process has CAP_SYS_RESOURCE: without it the kernel takes
/// PSI triggers with 2 s windows only.
pub fn sys_resource() -> bool {
    effective().is_ok_and(|e| e & (1 << CAP_SYS_RESOURCE) != 0)
}

/// The highest capability this kernel knows.
fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(CAP_BPF)
}

/// What is missing from `eff` on a kernel whose last capability is
/// `last_cap`, as the error says it; None when nothing is.
pub fn missing(eff: u64, last_cap: u32) -> Option<String> {
    let has = |c: u32| eff & (1 << c) != 0;
    if has(CAP_SYS_ADMIN) {
        return None;
    }
    if last_cap < CAP_BPF {
        return Some("CAP_SYS_ADMIN (this kernel has no CAP_BPF)".into());
    }
    let lacking: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|(c, _)| !has(*c))
        .map(|(_, n)| n)
        .collect();
    if lacking.is_empty() {
        return None;
    }
    Some(format!("{} (or CAP_SYS_ADMIN)", lacking.join(" and ")))
}

/// An error naming what is missing, unless this process may load and attach
/// tracing programs.
pub fn check() -> Result<()> {
    let eff = effective().map_err(|e| Error::Runtime(format!("capget: {e}")))?;
    match missing(eff, last_cap()) {
        None => Ok(()),
        Some(m) => Err(Error::MissingCaps(m)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_reads_need_cap_bpf_only_before_6_5_with_unprivileged_bpf_disabled() {
        assert_eq!(map_reads_need("6.18.0", true, 40), None);
        assert_eq!(map_reads_need("6.5.0-1-amd64", true, 40), None);
        assert_eq!(map_reads_need("5.10.0-46-amd64", false, 40), None);
        assert_eq!(
            map_reads_need("5.10.0-46-amd64", true, 40),
            Some((1 << CAP_BPF, "CAP_BPF"))
        );
        assert_eq!(
            map_reads_need("6.1.0-56-cloud-amd64", true, 40).map(|k| k.1),
            Some("CAP_BPF")
        );
        assert_eq!(
            map_reads_need("5.4.0", true, 37).map(|k| k.1),
            Some("CAP_SYS_ADMIN")
        );
        assert_eq!(map_reads_need("garbage", true, 40), None);
    }

    const ALL: u64 = (1 << 41) - 1;

    #[test]
    fn root_or_sys_admin_or_bpf_and_perfmon_are_enough() {
        assert_eq!(missing(ALL, 40), None);
        assert_eq!(missing(1 << CAP_SYS_ADMIN, 40), None);
        assert_eq!(missing(1 << CAP_BPF | 1 << CAP_PERFMON, 40), None);
    }

    #[test]
    fn names_exactly_what_is_missing() {
        let without = |caps: &[u32]| caps.iter().fold(ALL, |m, c| m & !(1 << c));
        assert_eq!(
            missing(without(&[CAP_SYS_ADMIN, CAP_BPF, CAP_PERFMON]), 40).unwrap(),
            "CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)"
        );
        assert_eq!(
            missing(without(&[CAP_SYS_ADMIN, CAP_PERFMON]), 40).unwrap(),
            "CAP_PERFMON (or CAP_SYS_ADMIN)"
        );
        // Before 5.8 only CAP_SYS_ADMIN will do.
        assert_eq!(
            missing(without(&[CAP_SYS_ADMIN]), 37).unwrap(),
            "CAP_SYS_ADMIN (this kernel has no CAP_BPF)"
        );
    }

    #[test]
    fn capget_agrees_with_proc_status() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .unwrap()
            .trim();
        assert_eq!(effective().unwrap(), u64::from_str_radix(hex, 16).unwrap());
    }
}
