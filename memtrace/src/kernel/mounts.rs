//! The mounts memtrace can see (/proc/self/mounts): where tracefs and the
//! cgroup filesystems are.

/// (filesystem type, mount point) of every mount memtrace can see, from
/// /proc/self/mounts (octal escapes such as `\040` decoded).
pub fn mounts() -> Vec<(String, std::path::PathBuf)> {
    with_options()
        .into_iter()
        .map(|(t, at, _)| (t, at))
        .collect()
}

/// The same with each mount's options (a v1 cgroup's are its controllers).
pub fn with_options() -> Vec<(String, std::path::PathBuf, String)> {
    let text = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    parse_mounts(&text)
}

pub fn parse_mounts(text: &str) -> Vec<(String, std::path::PathBuf, String)> {
    let unescape = |s: &str| {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            let oct = b
                .get(i + 1..i + 4)
                .filter(|o| o.iter().all(|c| (b'0'..=b'7').contains(c)));
            match (b[i], oct) {
                (b'\\', Some(o)) => {
                    out.push(((o[0] - b'0') << 6) | ((o[1] - b'0') << 3) | (o[2] - b'0'));
                    i += 4;
                }
                (c, _) => {
                    out.push(c);
                    i += 1;
                }
            }
        }
        std::path::PathBuf::from(
            <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out),
        )
    };
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, at, ty) = (f.next()?, f.next()?, f.next()?);
            Some((
                ty.to_string(),
                unescape(at),
                f.next().unwrap_or("").to_string(),
            ))
        })
        .collect()
}
