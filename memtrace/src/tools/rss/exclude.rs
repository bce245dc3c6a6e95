//! Mappings left out of rss's threshold (`--exclude`): by name or by exact
//! size, and the bytes of a process's mappings they cover.

use crate::stacks::args::parse_size;

#[derive(Debug, Clone, PartialEq)]
pub enum Exclude {
    Name(String),
    Size(u64),
}

impl Exclude {
    pub fn parse(s: &str) -> Exclude {
        match parse_size(s) {
            Ok(n) if s.chars().next().is_some_and(|c| c.is_ascii_digit()) => Exclude::Size(n),
            _ => Exclude::Name(s.to_string()),
        }
    }
}

pub fn excluded_bytes(maps: &[crate::process::proc::SmapsEntry], ex: &[Exclude]) -> u64 {
    maps.iter()
        .filter(|m| {
            ex.iter().any(|e| match e {
                Exclude::Name(n) => m.name.contains(n.as_str()),
                Exclude::Size(s) => m.end - m.start == *s,
            })
        })
        .map(|m| m.rss)
        .sum()
}
