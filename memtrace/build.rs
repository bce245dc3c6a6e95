use anyhow::{anyhow, Context as _};
use aya_build::{Package, Toolchain};

/// Builds the kernel programs (memtrace-ebpf) for the BPF target with the
/// nightly toolchain and leaves the object in OUT_DIR for `include_bytes!`.
fn main() -> anyhow::Result<()> {
    let meta = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let pkg = meta
        .packages
        .into_iter()
        .find(|p| p.name.as_str() == "memtrace-ebpf")
        .ok_or_else(|| anyhow!("memtrace-ebpf package not found"))?;
    let root = pkg
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent dir"))?;
    aya_build::build_ebpf(
        [Package {
            name: pkg.name.as_str(),
            root_dir: root.as_str(),
            ..Default::default()
        }],
        Toolchain::default(),
    )
}
