//! Names for the numbers syscalls take and return: errno, mmap prot and
//! flags, mremap flags, SysV shm flags and commands. Shared by the snoop tools.

use libc::c_int;

macro_rules! names {
    ($($c:ident),* $(,)?) => { &[$((libc::$c as u64, stringify!($c))),*] };
}

/// Errno values Linux returns, named as in errno(3).
const ERRNOS: &[(u64, &str)] = names!(
    EPERM,
    ENOENT,
    ESRCH,
    EINTR,
    EIO,
    ENXIO,
    E2BIG,
    ENOEXEC,
    EBADF,
    ECHILD,
    EAGAIN,
    ENOMEM,
    EACCES,
    EFAULT,
    ENOTBLK,
    EBUSY,
    EEXIST,
    EXDEV,
    ENODEV,
    ENOTDIR,
    EISDIR,
    EINVAL,
    ENFILE,
    EMFILE,
    ENOTTY,
    ETXTBSY,
    EFBIG,
    ENOSPC,
    ESPIPE,
    EROFS,
    EMLINK,
    EPIPE,
    EDOM,
    ERANGE,
    EDEADLK,
    ENAMETOOLONG,
    ENOLCK,
    ENOSYS,
    ENOTEMPTY,
    ELOOP,
    ENOMSG,
    EIDRM,
    ENOSTR,
    ENODATA,
    ETIME,
    ENOSR,
    ENOLINK,
    EPROTO,
    EBADMSG,
    EOVERFLOW,
    EILSEQ,
    EUSERS,
    ENOTSOCK,
    EOPNOTSUPP,
    ETIMEDOUT,
    EALREADY,
    EINPROGRESS,
    ESTALE,
    EDQUOT,
    ECANCELED,
    EOWNERDEAD,
    ENOTRECOVERABLE,
    ERFKILL,
    EHWPOISON,
);

/// "ENOMEM" for 12 (or -12); "errno 4000" for what has no name.
pub fn errno_name(e: i64) -> String {
    let e = e.unsigned_abs();
    ERRNOS
        .iter()
        .find(|(n, _)| *n == e)
        .map(|(_, s)| s.to_string())
        .unwrap_or_else(|| format!("errno {e}"))
}

/// Names of the bits set in `v`, joined with '|', then any bits left over in hex.
fn bits(v: u64, table: &[(u64, &str)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = v;
    for (bit, name) in table {
        if *bit != 0 && rest & bit == *bit {
            out.push(name.to_string());
            rest &= !bit;
        }
    }
    if rest != 0 {
        out.push(format!("{rest:#x}"));
    }
    out
}

fn join(parts: Vec<String>, empty: &str) -> String {
    if parts.is_empty() {
        empty.to_string()
    } else {
        parts.join("|")
    }
}

/// mmap/mprotect protection as `RWX`, `R--`, `---`; any other bits follow.
pub fn prot(p: u64) -> String {
    let mut s = String::new();
    for (bit, c) in [
        (libc::PROT_READ, 'R'),
        (libc::PROT_WRITE, 'W'),
        (libc::PROT_EXEC, 'X'),
    ] {
        s.push(if p & bit as u64 != 0 { c } else { '-' });
    }
    let rest = p & !((libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64);
    let extra = bits(
        rest,
        &[
            (libc::PROT_GROWSDOWN as u64, "GROWSDOWN"),
            (libc::PROT_GROWSUP as u64, "GROWSUP"),
        ],
    );
    if !extra.is_empty() {
        s.push('|');
        s.push_str(&extra.join("|"));
    }
    s
}

const MAP_BITS: &[(u64, &str)] = &[
    (libc::MAP_FIXED as u64, "FIXED"),
    (libc::MAP_ANONYMOUS as u64, "ANONYMOUS"),
    #[cfg(target_arch = "x86_64")]
    (libc::MAP_32BIT as u64, "32BIT"),
    (libc::MAP_GROWSDOWN as u64, "GROWSDOWN"),
    (libc::MAP_DENYWRITE as u64, "DENYWRITE"),
    (libc::MAP_EXECUTABLE as u64, "EXECUTABLE"),
    (libc::MAP_LOCKED as u64, "LOCKED"),
    (libc::MAP_NORESERVE as u64, "NORESERVE"),
    (libc::MAP_POPULATE as u64, "POPULATE"),
    (libc::MAP_NONBLOCK as u64, "NONBLOCK"),
    (libc::MAP_STACK as u64, "STACK"),
    (libc::MAP_HUGETLB as u64, "HUGETLB"),
    (libc::MAP_SYNC as u64, "SYNC"),
    (libc::MAP_FIXED_NOREPLACE as u64, "FIXED_NOREPLACE"),
];

/// mmap flags as `PRIVATE|ANONYMOUS|FIXED`: the mapping type first, then the
/// flag bits, then a huge page size (`HUGE_2MB`) if one is encoded.
pub fn mmap_flags(f: u64) -> String {
    let ty = f & libc::MAP_TYPE as u64;
    let mut parts = vec![match ty as c_int {
        libc::MAP_SHARED => "SHARED".to_string(),
        libc::MAP_PRIVATE => "PRIVATE".to_string(),
        libc::MAP_SHARED_VALIDATE => "SHARED_VALIDATE".to_string(),
        libc::MAP_DROPPABLE => "DROPPABLE".to_string(),
        t => format!("TYPE_{t:#x}"),
    }];
    // The size field means something only with MAP_HUGETLB.
    let shift = libc::MAP_HUGE_SHIFT as u64;
    let huge = if f & libc::MAP_HUGETLB as u64 != 0 {
        (f >> shift) & libc::MAP_HUGE_MASK as u64
    } else {
        0
    };
    let rest = f & !(libc::MAP_TYPE as u64) & !(huge << shift);
    parts.extend(bits(rest, MAP_BITS));
    if huge != 0 {
        // The field holds log2 of the page size.
        let size = 1u64 << huge;
        parts.push(match size {
            s if s >= 1 << 30 => format!("HUGE_{}GB", s >> 30),
            s if s >= 1 << 20 => format!("HUGE_{}MB", s >> 20),
            s => format!("HUGE_{}KB", s >> 10),
        });
    }
    parts.join("|")
}

pub fn mremap_flags(f: u64) -> String {
    join(
        bits(
            f,
            &[
                (libc::MREMAP_MAYMOVE as u64, "MAYMOVE"),
                (libc::MREMAP_FIXED as u64, "FIXED"),
                (libc::MREMAP_DONTUNMAP as u64, "DONTUNMAP"),
            ],
        ),
        "0",
    )
}

/// shmget flags as `IPC_CREAT|IPC_EXCL|0600`: the low nine bits are the mode.
pub fn shmget_flags(f: u64) -> String {
    let mode = f & 0o777;
    let mut parts = bits(
        f & !0o777,
        names!(IPC_CREAT, IPC_EXCL, SHM_HUGETLB, SHM_NORESERVE),
    );
    parts.push(format!("{mode:04o}"));
    parts.join("|")
}

pub fn shmat_flags(f: u64) -> String {
    join(
        bits(f, names!(SHM_RDONLY, SHM_RND, SHM_REMAP, SHM_EXEC)),
        "0",
    )
}

// Commands the libc crate does not define (include/uapi/linux/shm.h, ipc.h).
const SHM_STAT: c_int = 13;
const SHM_INFO: c_int = 14;
const SHM_STAT_ANY: c_int = 15;
/// Set by some C libraries on the command for the 64-bit structures.
const IPC_64: c_int = 0x100;

pub fn shmctl_cmd(c: u64) -> String {
    let c = c as c_int;
    let name = match c & !IPC_64 {
        libc::IPC_RMID => "IPC_RMID".to_string(),
        libc::IPC_SET => "IPC_SET".to_string(),
        libc::IPC_STAT => "IPC_STAT".to_string(),
        libc::IPC_INFO => "IPC_INFO".to_string(),
        libc::SHM_LOCK => "SHM_LOCK".to_string(),
        libc::SHM_UNLOCK => "SHM_UNLOCK".to_string(),
        SHM_STAT => "SHM_STAT".to_string(),
        SHM_INFO => "SHM_INFO".to_string(),
        SHM_STAT_ANY => "SHM_STAT_ANY".to_string(),
        other => other.to_string(),
    };
    if c & IPC_64 != 0 {
        format!("{name}|IPC_64")
    } else {
        name
    }
}

/// An shm key: hex, or IPC_PRIVATE.
pub fn shm_key(k: u64) -> String {
    let k = k as i32;
    if k == libc::IPC_PRIVATE {
        "IPC_PRIVATE".to_string()
    } else {
        format!("{:#x}", k as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos() {
        assert_eq!(errno_name(-12), "ENOMEM");
        assert_eq!(errno_name(22), "EINVAL");
        assert_eq!(errno_name(-4000), "errno 4000");
    }

    #[test]
    fn protections() {
        assert_eq!(prot(0), "---");
        assert_eq!(prot(0x1), "R--");
        assert_eq!(prot(0x3), "RW-");
        assert_eq!(prot(0x5), "R-X");
        assert_eq!(prot(0x7), "RWX");
        assert_eq!(prot(0x1000001), "R--|GROWSDOWN");
        assert_eq!(prot(0x11), "R--|0x10");
    }

    #[test]
    fn mmap_flag_names() {
        // Values from include/uapi/asm-generic/mman*.h, written out so the
        // test does not reuse the table it checks.
        assert_eq!(mmap_flags(0x22), "PRIVATE|ANONYMOUS");
        assert_eq!(mmap_flags(0x01), "SHARED");
        assert_eq!(mmap_flags(0x32), "PRIVATE|FIXED|ANONYMOUS");
        assert_eq!(mmap_flags(0x4022), "PRIVATE|ANONYMOUS|NORESERVE");
        assert_eq!(mmap_flags(0x100022), "PRIVATE|ANONYMOUS|FIXED_NOREPLACE");
        assert_eq!(
            mmap_flags(0x40022 | (21 << 26)),
            "PRIVATE|ANONYMOUS|HUGETLB|HUGE_2MB"
        );
        assert_eq!(mmap_flags(0x03), "SHARED_VALIDATE");
        assert_eq!(mmap_flags(0x8000_0002), "PRIVATE|0x80000000");
    }

    #[test]
    fn mremap_and_shm() {
        assert_eq!(mremap_flags(1), "MAYMOVE");
        assert_eq!(mremap_flags(3), "MAYMOVE|FIXED");
        assert_eq!(mremap_flags(0), "0");
        assert_eq!(shmget_flags(0o1000 | 0o600), "IPC_CREAT|0600");
        assert_eq!(shmget_flags(0o3000 | 0o640), "IPC_CREAT|IPC_EXCL|0640");
        assert_eq!(shmget_flags(0o4000 | 0o600), "SHM_HUGETLB|0600");
        assert_eq!(shmat_flags(0o10000), "SHM_RDONLY");
        assert_eq!(shmat_flags(0), "0");
        assert_eq!(shmctl_cmd(0), "IPC_RMID");
        assert_eq!(shmctl_cmd(2), "IPC_STAT");
        assert_eq!(shmctl_cmd(0x102), "IPC_STAT|IPC_64");
        assert_eq!(shmctl_cmd(14), "SHM_INFO");
        assert_eq!(shm_key(0), "IPC_PRIVATE");
        assert_eq!(shm_key(0x1234), "0x1234");
    }
}
