//! The house's layout: the userspace's wings, and the one direction they
//! import in. A wing imports only wings below it in `WINGS`, so there is no
//! cycle among them and a shared type lives below every wing that uses it.
//! Reads the sources; needs no root.

use std::collections::BTreeMap;
use std::path::Path;

/// Lowest first. A new top-level module has to be placed here.
const WINGS: [&str; 12] = [
    "error", "kernel", "output", "process", "session", "stacks", "probes", "record", "run",
    "tools", "doctor", "cli",
];

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The wings `text` names through `crate::`, comments left out.
fn imports(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + 7..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.push(match name.as_str() {
                // The crate root re-exports error's types.
                "Error" | "Result" => "error".to_string(),
                _ => name,
            });
        }
    }
    out
}

#[test]
fn wings_import_only_wings_below_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../memtrace/src");
    let rank: BTreeMap<&str, usize> = WINGS.iter().enumerate().map(|(i, w)| (*w, i)).collect();
    let mut top: Vec<String> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| Some(p.file_stem()?.to_str()?.to_string()))
        .filter(|n| n != "lib" && n != "main")
        .collect();
    top.sort();
    for m in &top {
        assert!(
            rank.contains_key(m.as_str()),
            "top-level module {m} is in no wing of WINGS"
        );
    }
    assert!(top.len() <= 16, "{} top-level modules: {top:?}", top.len());

    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut upward = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap();
        let wing = first.trim_end_matches(".rs");
        let Some(&from) = rank.get(wing) else {
            continue; // lib.rs, main.rs: the root sees everything
        };
        for to in imports(&std::fs::read_to_string(f).unwrap()) {
            let r = *rank
                .get(to.as_str())
                .unwrap_or_else(|| panic!("{}: crate::{to} is in no wing", rel.display()));
            if r > from {
                upward.push(format!("{} imports {to}", rel.display()));
            }
        }
    }
    upward.sort();
    upward.dedup();
    assert!(
        upward.is_empty(),
        "imports up the wings:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_check_sees_an_upward_import() {
    // The parser itself: an import in code counts, one in a comment not.
    assert_eq!(
        imports("use crate::stacks::Traced; // crate::run"),
        ["stacks"]
    );
    assert_eq!(imports("let r: crate::Result<()> = Ok(());"), ["error"]);
    assert!(imports("//! see `crate::probes::exemaps`").is_empty());
}
