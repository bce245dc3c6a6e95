//! A frame as text: how it is written (`FrameStyle`), parsed back from the
//! symbolizer's text as the record file keeps it, and the stack fingerprint: a stable hash of function names and
//! modules, so a stack keeps its id across ASLR, rebuilds that move code,
//! and frame styles (`--lines`, `--addresses`).

use serde::{Deserialize, Serialize};

/// How a frame is written: by function (the default, so that the same code
/// path merges across call sites, processes and flame-graph tools), with
/// its source line (`--lines`), or with the raw offset (`--addresses`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FrameStyle {
    #[default]
    Function,
    Lines,
    Addresses,
}

/// What stands for the module of an address no file holds: the process's
/// maps did not place it, the code is anonymous, or the process was gone.
pub const NOT_A_FILE: [&str; 3] = [
    "unknown",
    "anonymous",
    "process exited before its maps were read",
];

/// One symbolized frame.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    /// Function name, or the address or note when there is none.
    #[serde(rename = "f")]
    pub func: String,
    #[serde(rename = "o", default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(rename = "l", default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    #[serde(rename = "m", default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
}

impl Frame {
    /// Parses what `symbolize::describe` writes: `name[+0xOFF][ (file:line)][ [module]]`.
    pub fn parse(s: &str) -> Frame {
        let mut rest = s;
        let mut f = Frame::default();
        if let Some(i) = rest.rfind(" [").filter(|_| rest.ends_with(']')) {
            f.module = Some(rest[i + 2..rest.len() - 1].to_string());
            rest = &rest[..i];
        }
        if let Some(i) = rest.rfind(" (").filter(|_| rest.ends_with(')')) {
            let inner = &rest[i + 2..rest.len() - 1];
            if let Some((file, line)) = inner.rsplit_once(':') {
                if let Ok(n) = line.parse::<u32>() {
                    f.file = Some(file.to_string());
                    f.line = Some(n);
                    rest = &rest[..i];
                }
            }
        }
        if let Some(i) = rest.rfind("+0x").filter(|&i| i > 0) {
            if let Ok(off) = u64::from_str_radix(&rest[i + 3..], 16) {
                f.offset = Some(off);
                rest = &rest[..i];
            }
        }
        f.func = rest.to_string();
        f
    }

    /// The frame as the live tools print it in `style`.
    pub fn render(&self, style: FrameStyle) -> String {
        let mut s = self.func.clone();
        if let (Some(off), FrameStyle::Addresses) = (self.offset, style) {
            s.push_str(&format!("+{off:#x}"));
        }
        if let (Some(file), Some(line), FrameStyle::Lines) = (&self.file, self.line, style) {
            s.push_str(&format!(" ({file}:{line})"));
        }
        if let Some(m) = &self.module {
            s.push_str(&format!(" [{m}]"));
        }
        s
    }

    /// What identifies the frame: its function; without one, its offset in
    /// its file (the same in every run), or, for code that is no file's
    /// (an address memtrace could not place), only "some code there".
    fn identity(&self) -> &str {
        let in_file = self
            .module
            .as_deref()
            .is_some_and(|m| !m.is_empty() && !m.starts_with('[') && !NOT_A_FILE.contains(&m));
        if self.func.starts_with("0x") && !in_file {
            "?"
        } else {
            &self.func
        }
    }
}

/// FNV-1a, 64 bits: written out here because std's hasher may change
/// between Rust releases, and ids are kept in files and reviews.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn put(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= x as u64;
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The stack id: 12 hex digits (48 bits) of the hash of every frame's
/// function and module, kernel frames then user frames.
pub fn fingerprint(kernel: &[Frame], user: &[Frame]) -> String {
    let mut h = Fnv::new();
    for (section, frames) in [(b"K", kernel), (b"U", user)] {
        h.put(section);
        for f in frames {
            h.put(f.identity().as_bytes());
            h.put(&[0]);
            h.put(f.module.as_deref().unwrap_or("").as_bytes());
            h.put(&[1]);
        }
    }
    format!("{:012x}", h.0 >> 16)
}

/// The id of a stack given as the live tools' frame text; None for a stack
/// without frames.
pub fn fingerprint_text<S: AsRef<str>>(kernel: &[S], user: &[S]) -> Option<String> {
    if kernel.is_empty() && user.is_empty() {
        return None;
    }
    let k: Vec<Frame> = kernel.iter().map(|s| Frame::parse(s.as_ref())).collect();
    let u: Vec<Frame> = user.iter().map(|s| Frame::parse(s.as_ref())).collect();
    Some(fingerprint(&k, &u))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_in_their_style() {
        let cases = [
            ("memset [libc.so.6]", FrameStyle::Function),
            ("memset+0xc0 [libc.so.6]", FrameStyle::Addresses),
            (
                "grow_heap (tests/workload/main.rs:31) [memtrace-workload]",
                FrameStyle::Lines,
            ),
            ("handle_mm_fault", FrameStyle::Function),
            ("handle_mm_fault+0x1a", FrameStyle::Addresses),
            ("0x7f00dead [unknown]", FrameStyle::Function),
            ("[not sampled (--sample)]", FrameStyle::Function),
            ("operator+ [libfoo.so]", FrameStyle::Addresses),
            ("f (x) [m]", FrameStyle::Lines),
        ];
        for (s, style) in cases {
            assert_eq!(Frame::parse(s).render(style), s, "{s}");
        }
        let f = Frame::parse("grow (src/a.rs:31) [w]");
        assert_eq!(
            (f.func.as_str(), f.line, f.module.as_deref()),
            ("grow", Some(31), Some("w"))
        );
        assert_eq!(f.render(FrameStyle::Function), "grow [w]");
    }

    fn ids(user: &[&str]) -> String {
        let u: Vec<String> = user.iter().map(|s| s.to_string()).collect();
        fingerprint_text(&[], &u).unwrap()
    }

    #[test]
    fn fingerprint_ignores_addresses_offsets_and_lines() {
        let plain = ids(&["grow [w]", "main [w]"]);
        assert_eq!(plain.len(), 12);
        assert_eq!(plain, ids(&["grow+0x1f [w]", "main+0x20 [w]"]));
        assert_eq!(plain, ids(&["grow (a.rs:3) [w]", "main (a.rs:9) [w]"]));
        // Unsymbolized frames of a file: its offset there counts (two call
        // sites in a stripped function are two stacks, as printed).
        assert_ne!(
            ids(&["0x2d39c [w]", "main [w]"]),
            ids(&["0x2d2e2 [w]", "main [w]"])
        );
        assert_eq!(
            ids(&["0x2d39c [w]", "main [w]"]),
            ids(&["0x2d39c [w]", "main+0x10 [w]"])
        );
        // Addresses no file holds vary from run to run: they do not count.
        for m in [
            "unknown",
            "anonymous",
            "process exited before its maps were read",
        ] {
            assert_eq!(
                ids(&[&format!("0x5555deadbeef [{m}]"), "main [w]"]),
                ids(&[&format!("0x7fffcafe0000 [{m}]"), "main [w]"])
            );
        }
        assert_ne!(plain, ids(&["grow [w]", "main [other]"]));
        assert_ne!(plain, ids(&["main [w]", "grow [w]"]));
        assert_ne!(plain, ids(&["grow [w]"]));
        // Kernel and user frames are kept apart.
        let k = vec!["grow [w]".to_string()];
        let u = vec!["main [w]".to_string()];
        assert_ne!(
            fingerprint_text(&k, &u),
            fingerprint_text(&[], &[k[0].clone(), u[0].clone()])
        );
        assert_eq!(fingerprint_text::<&str>(&[], &[]), None);
    }

    #[test]
    fn fingerprint_is_stable_across_releases() {
        // FNV-1a of "K" "U" "main" 0 "w" 1, computed apart from this code
        // (a few lines of Python); a change here breaks every annotation
        // database in the field.
        assert_eq!(ids(&["main [w]"]), "fb0ceb9e6178");
        assert_eq!(ids(&["main+0x1 [w]"]), "fb0ceb9e6178");
    }
}
