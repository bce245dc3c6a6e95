//! Kernel modules the guest loads: zram for swap (the stock Debian kernels
//! build it as a module, and every block driver a swap file could sit on
//! too), with the modules it depends on. Taken once from the cached
//! `linux-image` package, uncompressed (busybox `insmod` loads plain ELF),
//! into `<cache>/<pkg>/modules/` with an `order` file, dependencies first.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The modules the guest asks for; their dependencies come along.
const WANTED: [&str; 1] = ["zram"];

/// Runs `dpkg-deb --fsys-tarfile DEB | tar ARGS`, returning tar's stdout.
fn tar(deb: &Path, args: &[&str]) -> Result<Vec<u8>> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"set -e; d="$1"; shift; dpkg-deb --fsys-tarfile "$d" | tar "$@""#)
        .arg("sh")
        .arg(deb)
        .args(args)
        .output()
        .context("running dpkg-deb | tar")?;
    if !out.status.success() {
        bail!(
            "tar {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// A module's name as the kernel knows it: `lz4hc_compress` for
/// `.../lz4hc_compress.ko.xz` (dashes and underscores are the same).
fn module_name(path: &str) -> Option<String> {
    let file = path.rsplit('/').next()?;
    let stem = file
        .strip_suffix(".ko")
        .or_else(|| file.strip_suffix(".ko.xz"))
        .or_else(|| file.strip_suffix(".ko.zst"))?;
    Some(stem.replace('-', "_"))
}

/// The `depends=` list of a module's `.modinfo` (NUL-separated key=value).
fn depends(ko: &[u8]) -> Vec<String> {
    ko.split(|&b| b == 0)
        .find_map(|s| s.strip_prefix(b"depends="))
        .map(|d| {
            String::from_utf8_lossy(d)
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| s.replace('-', "_"))
                .collect()
        })
        .unwrap_or_default()
}

/// The module file's content as ELF, decompressing `.xz` and `.zst`.
fn plain(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        "xz"
    } else if name.ends_with(".zst") {
        "zstd"
    } else {
        return Ok(std::fs::read(path)?);
    };
    let out = Command::new(tool)
        .arg("-dc")
        .arg(path)
        .output()
        .with_context(|| format!("running {tool}"))?;
    if !out.status.success() || !out.stdout.starts_with(b"\x7fELF") {
        bail!("{tool} -dc {name} failed");
    }
    Ok(out.stdout)
}

/// Puts WANTED and their dependencies from `deb` into `dir`, once.
pub(super) fn extract(deb: &Path, dir: &Path) -> Result<()> {
    let order_file = dir.join("order");
    if order_file.exists() {
        return Ok(());
    }
    let listing = String::from_utf8(tar(deb, &["-t"])?)?;
    let paths: BTreeMap<String, String> = listing
        .lines()
        .filter(|l| l.contains("/kernel/"))
        .filter_map(|l| Some((module_name(l)?, l.to_string())))
        .collect();
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp)?;
    // name -> its dependencies, filled a round of extraction at a time.
    let mut deps: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut todo: Vec<String> = WANTED.iter().map(|s| s.to_string()).collect();
    while !todo.is_empty() {
        let mut files = Vec::new();
        for m in &todo {
            files.push(
                paths
                    .get(m)
                    .with_context(|| format!("no module {m} in {}", deb.display()))?
                    .as_str(),
            );
        }
        let mut args = vec!["-x", "-C", tmp.to_str().context("cache path")?];
        args.extend(files.iter().copied());
        tar(deb, &args)?;
        let mut next = Vec::new();
        for (m, f) in todo.iter().zip(&files) {
            let ko = plain(&tmp.join(f))?;
            std::fs::write(dir.join(format!("{m}.ko")), &ko)?;
            let d = depends(&ko);
            next.extend(d.iter().filter(|x| !deps.contains_key(*x)).cloned());
            deps.insert(m.clone(), d);
        }
        next.sort();
        next.dedup();
        next.retain(|m| !deps.contains_key(m));
        todo = next;
    }
    std::fs::remove_dir_all(&tmp)?;
    let mut order = Vec::new();
    for m in WANTED {
        post_order(m, &deps, &mut order);
    }
    std::fs::write(order_file, order.join("\n") + "\n")?;
    Ok(())
}

/// Dependencies before the modules that need them.
fn post_order(m: &str, deps: &BTreeMap<String, Vec<String>>, out: &mut Vec<String>) {
    if out.iter().any(|x| x == m) {
        return;
    }
    for d in deps.get(m).into_iter().flatten() {
        post_order(d, deps, out);
    }
    out.push(m.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_dependencies() {
        assert_eq!(
            module_name("./lib/modules/6.12/kernel/lib/lz4/lz4hc_compress.ko.xz").as_deref(),
            Some("lz4hc_compress")
        );
        assert_eq!(module_name("./lib/modules/6.1/kernel/mm/"), None);
        let ko = b"\x7fELF..\0license=GPL\0depends=lz4hc_compress,lz4-compress\0name=zram\0";
        assert_eq!(depends(ko), ["lz4hc_compress", "lz4_compress"]);
        let deps = BTreeMap::from([
            ("zram".to_string(), vec!["a".to_string(), "b".to_string()]),
            ("a".to_string(), vec!["b".to_string()]),
            ("b".to_string(), vec![]),
        ]);
        let mut order = Vec::new();
        post_order("zram", &deps, &mut order);
        assert_eq!(order, ["b", "a", "zram"]);
    }
}
