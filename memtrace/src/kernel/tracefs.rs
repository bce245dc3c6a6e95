//! Tracepoint format files: field offsets are read at run time because they
//! differ between kernels and distributions.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::Error;

const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The tracefs mount point. Where tracefs is not mounted, it is mounted at
/// /sys/kernel/tracing, and said, but only where nothing else is mounted:
/// memtrace never hides a filesystem someone put there.
pub fn root() -> Result<&'static Path, Error> {
    static ROOT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    ROOT.get_or_init(|| {
        let found = || {
            CANDIDATES
                .iter()
                .map(PathBuf::from)
                .find(|p| p.join("events").is_dir())
        };
        match found() {
            Some(p) => Ok(p),
            None => mount(Path::new(CANDIDATES[0]))
                .map(|()| found())?
                .ok_or_else(|| format!("tracefs at {} has no events", CANDIDATES[0])),
        }
    })
    .as_deref()
    .map_err(|why| Error::NoTracefs(why.clone()))
}

fn mount(at: &Path) -> Result<(), String> {
    let mounts = crate::kernel::mounts::mounts();
    if let Some((ty, _)) = mounts.iter().rev().find(|(_, p)| p == at) {
        return Err(if ty == "tracefs" {
            unreadable(at)
        } else {
            format!(
                "{} has a {ty} filesystem mounted on it: memtrace does not mount tracefs over it",
                at.display()
            )
        });
    }
    if !at.is_dir() {
        return Err(format!("{} does not exist", at.display()));
    }
    use std::os::unix::ffi::OsStrExt;
    let target = std::ffi::CString::new(at.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: NUL-terminated strings that outlive the call; no data argument.
    let r = unsafe {
        libc::mount(
            c"tracefs".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(format!(
            "mounting it at {}: {}",
            at.display(),
            std::io::Error::last_os_error()
        ));
    }
    say!(
        "memtrace: tracefs was not mounted; mounted it at {} (it stays mounted)",
        at.display()
    );
    Ok(())
}

/// Why a mounted tracefs cannot be read, and the ways to let memtrace in:
/// it is root's, mode 0700 on most distributions, and CAP_BPF with
/// CAP_PERFMON do not open files.
fn unreadable(at: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let owner = match std::fs::metadata(at) {
        Ok(m) => format!(" (owner uid {}, mode {:04o})", m.uid(), m.mode() & 0o7777),
        Err(_) => String::new(),
    };
    format!(
        "tracefs is mounted at {} but uid {uid} cannot read it{owner}: run memtrace as root \
         (uid 0, with CAP_BPF and CAP_PERFMON), grant it CAP_DAC_READ_SEARCH, or make \
         tracefs readable (mount -o remount,mode=0755 {})",
        at.display(),
        at.display()
    )
}

pub fn exists(category: &str, name: &str) -> bool {
    root()
        .map(|r| r.join("events").join(category).join(name).is_dir())
        .unwrap_or(false)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub ty: String,
    pub offset: u32,
    pub size: u32,
    pub signed: bool,
}

#[derive(Debug, Clone, Default)]
pub struct Format {
    pub name: String,
    pub fields: Vec<Field>,
    /// The `print fmt:` line: enum names live there (`__print_symbolic`).
    pub print: String,
}

impl Format {
    pub fn load(category: &str, name: &str) -> Result<Format, Error> {
        let path = root()?
            .join("events")
            .join(category)
            .join(name)
            .join("format");
        let text = std::fs::read_to_string(&path).map_err(|_| Error::NoTracepoint {
            category: category.into(),
            name: name.into(),
        })?;
        Ok(Format::parse(&text))
    }

    /// Parses the text of a `format` file.
    pub fn parse(text: &str) -> Format {
        let mut fmt = Format::default();
        for line in text.lines() {
            let line = line.trim();
            if let Some(n) = line.strip_prefix("name:") {
                fmt.name = n.trim().to_string();
                continue;
            }
            if let Some(p) = line.strip_prefix("print fmt:") {
                fmt.print = p.trim().to_string();
                continue;
            }
            let Some(rest) = line.strip_prefix("field:") else {
                continue;
            };
            let mut decl = "";
            let (mut offset, mut size, mut signed) = (None, None, false);
            for part in rest.split(';') {
                let part = part.trim();
                if let Some(v) = part.strip_prefix("offset:") {
                    offset = v.trim().parse().ok();
                } else if let Some(v) = part.strip_prefix("size:") {
                    size = v.trim().parse().ok();
                } else if let Some(v) = part.strip_prefix("signed:") {
                    signed = v.trim() == "1";
                } else if decl.is_empty() && !part.is_empty() {
                    decl = part;
                }
            }
            let (Some(offset), Some(size)) = (offset, size) else {
                continue;
            };
            // "unsigned long nr_reclaimed" or "char comm[16]": the name is the
            // last word, without any array suffix.
            let last = decl.rsplit(' ').next().unwrap_or(decl);
            let name = last.split('[').next().unwrap_or(last).to_string();
            let ty = decl[..decl.len() - last.len()].trim().to_string();
            fmt.fields.push(Field {
                name,
                ty,
                offset,
                size,
                signed,
            });
        }
        fmt
    }

    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// The names the print format gives `field`'s values
    /// (`__print_symbolic(REC->field, {1, "skipped"}, ...)`): an enum's
    /// values as this kernel numbers them.
    pub fn symbols(&self, field: &str) -> Result<Vec<(i64, String)>, Error> {
        let missing = || Error::NoField {
            tracepoint: self.name.clone(),
            field: format!("{field} (names in the print format)"),
        };
        let head = format!("__print_symbolic(REC->{field},");
        let at = self.print.find(&head).ok_or_else(missing)?;
        let mut out = Vec::new();
        let mut rest = &self.print[at + head.len()..];
        // Pairs until the call's closing parenthesis.
        while let Some(open) = rest.find(['{', ')']) {
            if rest.as_bytes()[open] == b')' {
                break;
            }
            let close = rest[open..].find('}').ok_or_else(missing)? + open;
            let (v, name) = rest[open + 1..close].split_once(',').ok_or_else(missing)?;
            let v = v.trim();
            let v = match v.strip_prefix("0x") {
                Some(h) => i64::from_str_radix(h, 16),
                None => v.parse(),
            }
            .map_err(|_| missing())?;
            out.push((v, name.trim().trim_matches('"').to_string()));
            rest = &rest[close + 1..];
        }
        match out.is_empty() {
            true => Err(missing()),
            false => Ok(out),
        }
    }

    /// Offset of `name`, or an error naming the tracepoint and field.
    pub fn offset(&self, name: &str) -> Result<u32, Error> {
        self.field(name)
            .map(|f| f.offset)
            .ok_or_else(|| Error::NoField {
                tracepoint: self.name.clone(),
                field: name.into(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Saved from this machine's 6.18 kernel.
    const MARK_VICTIM: &str = include_str!("../../tests/data/mark_victim.format");
    const SYS_ENTER_MMAP: &str = include_str!("../../tests/data/sys_enter_mmap.format");

    #[test]
    fn parses_mark_victim() {
        let f = Format::parse(MARK_VICTIM);
        assert_eq!(f.name, "mark_victim");
        assert_eq!(f.offset("pid").unwrap(), 8);
        assert_eq!(f.offset("comm").unwrap(), 12);
        assert_eq!(f.field("comm").unwrap().ty, "__data_loc char[]");
        assert_eq!(f.offset("anon_rss").unwrap(), 24);
        assert_eq!(f.offset("oom_score_adj").unwrap(), 64);
        assert!(f.field("oom_score_adj").unwrap().signed);
        assert!(f.offset("nope").is_err());
    }

    #[test]
    fn names_of_an_enum_come_from_the_print_format() {
        // mm_compaction_end's, from this machine's 6.18 kernel.
        let f = Format::parse(
            "name: mm_compaction_end\n\
             \tfield:int status;\toffset:44;\tsize:4;\tsigned:1;\n\n\
             print fmt: \"zone_start=0x%lx status=%s\", REC->zone_start, \
             __print_symbolic(REC->status, {1, \"skipped\"}, {2, \"deferred\"}, \
             {8, \"success\"}, {0, \"not_suitable_zone\"}, {7, \"contended\"})",
        );
        let s = f.symbols("status").unwrap();
        assert_eq!(s.len(), 5);
        assert_eq!(s[0], (1, "skipped".to_string()));
        assert_eq!(s[2], (8, "success".to_string()));
        assert_eq!(s[4], (7, "contended".to_string()));
        assert!(f.symbols("zone_start").is_err());
    }

    #[test]
    fn parses_syscall_format() {
        let f = Format::parse(SYS_ENTER_MMAP);
        assert_eq!(f.offset("__syscall_nr").unwrap(), 8);
        assert_eq!(f.offset("addr").unwrap(), 16);
        assert_eq!(f.offset("len").unwrap(), 24);
        assert_eq!(f.offset("off").unwrap(), 56);
        assert_eq!(f.field("common_pid").unwrap().size, 4);
    }
}
