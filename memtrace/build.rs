use anyhow::{anyhow, Context as _};
use aya_build::{Package, Toolchain};
use object::{Object as _, ObjectSection as _};

/// Builds the kernel programs (memtrace-ebpf) for the BPF target with the
/// nightly pinned in memtrace-ebpf/rust-toolchain.toml and leaves the object in OUT_DIR for `include_bytes!`,
/// without DWARF or BTF line info (`memtrace.obj`).
fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=MEMTRACE_NO_EBPF");
    if std::env::var_os("MEMTRACE_NO_EBPF").is_some() {
        // The fuzz targets link the parsers only: no kernel programs, and no
        // nested cargo run under the fuzzer's sanitizer flags.
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
        std::fs::write(out.join("memtrace.obj"), b"")?;
        std::fs::write(out.join("memtrace-compat.obj"), b"")?;
        std::fs::write(out.join("memtrace_preload.so"), b"")?;
        return Ok(());
    }
    preload()?;
    // The object, and the one for kernels without bpf_loop (5.10, 5.15),
    // which memtrace picks at load time.
    for (features, name) in [
        (&[][..], "memtrace.obj"),
        (&["compat"][..], "memtrace-compat.obj"),
    ] {
        build(features)?;
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
        let obj = std::fs::read(out.join("memtrace")).context("reading the eBPF object")?;
        let mut obj = without_dwarf(&obj)?;
        drop_line_info(&mut obj)?;
        std::fs::write(out.join(name), obj).context("writing the eBPF object")?;
    }
    Ok(())
}

/// The object without its DWARF sections: the BTF generated from them is
/// what the loader needs. aya reads every section's relocations, so the
/// DWARF's were parsed (and paged in) at every start.
fn without_dwarf(obj: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut b = object::build::elf::Builder::read(obj).context("reading the eBPF object")?;
    let debug: Vec<_> = b
        .sections
        .iter()
        .filter(|s| s.name.starts_with(b".debug_"))
        .map(|s| s.id())
        .collect();
    for s in b.sections.iter_mut() {
        let of_debug = s.sh_info_section.is_some_and(|i| debug.contains(&i));
        if s.name.starts_with(b".debug_") || of_debug {
            s.delete = true;
        }
    }
    b.delete_orphans();
    // LLVM keeps section names in .strtab; the writer wants them apart.
    if !b.sections.iter().any(|s| s.name.as_slice() == b".shstrtab") {
        let sec = b.sections.add();
        sec.name = b".shstrtab"[..].into();
        sec.sh_type = object::elf::SHT_STRTAB;
        sec.sh_addralign = 1;
        sec.data = object::build::elf::SectionData::SectionString;
    }
    let mut out = Vec::new();
    b.write(&mut out).context("writing the eBPF object")?;
    Ok(out)
}

/// Empties the line info of `.BTF.ext` (its header's `line_info_len`). It maps
/// instructions to source lines for verifier logs only, and parsing it was
/// 2 MiB of memtrace's peak heap of 3.5; func info and relocations stay.
fn drop_line_info(obj: &mut [u8]) -> anyhow::Result<()> {
    let file = object::File::parse(&*obj).context("parsing the eBPF object")?;
    let Some(ext) = file.section_by_name(".BTF.ext") else {
        return Ok(());
    };
    let (start, size) = ext
        .file_range()
        .ok_or_else(|| anyhow!(".BTF.ext has no data"))?;
    // magic u16, version u8, flags u8, hdr_len u32, func_info off/len,
    // line_info off/len: line_info_len is bytes 20..24.
    let at = start as usize + 20;
    if size < 24 {
        anyhow::bail!(".BTF.ext header too short");
    }
    if obj[start as usize..start as usize + 2] != [0x9f, 0xeb] {
        anyhow::bail!(".BTF.ext is not little-endian BTF");
    }
    obj[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
    Ok(())
}

/// The C compiler for the target: `$CC_<target>`, else `$CC` when not
/// cross-compiling, else `cc`, or Debian's cross gcc (`aarch64-linux-gnu-gcc`).
fn c_compiler() -> anyhow::Result<String> {
    let (target, host) = (std::env::var("TARGET")?, std::env::var("HOST")?);
    let by_target = format!("CC_{}", target.replace('-', "_"));
    println!("cargo:rerun-if-env-changed={by_target}");
    println!("cargo:rerun-if-env-changed=CC");
    if let Ok(cc) = std::env::var(&by_target) {
        return Ok(cc);
    }
    if target == host {
        return Ok(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    }
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH")?;
    Ok(format!("{arch}-linux-gnu-gcc"))
}

/// Compiles memleak's allocator shim (preload/*.c) into a shared object
/// that memtrace embeds and writes out for `memleak -c`. The system C
/// compiler (`c_compiler`): a few files with no dependency but glibc
/// (libc and libm), so no build system is needed around them.
fn preload() -> anyhow::Result<()> {
    let srcs = [
        "preload/memtrace_preload.c",
        "preload/compose.c",
        "preload/cxx.c",
        "preload/jemalloc.c",
        "preload/frees.c",
        "preload/memo.c",
        "preload/sampled.c",
        "preload/sites.c",
        "preload/shim.h",
    ];
    for s in srcs {
        println!("cargo:rerun-if-changed={s}");
    }
    let src = srcs[0];
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("memtrace_preload.so");
    let cc = c_compiler()?;
    let status = std::process::Command::new(&cc)
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            // The sites' callers keep frame pointers: memleak's stacks walk them.
            "-fno-omit-frame-pointer",
            "-fvisibility=hidden",
            // Calls to the sites stay inside the object (no PLT).
            "-Wl,-Bsymbolic",
            "-Wl,-z,now",
            "-Wall",
            "-Werror",
            "-o",
        ])
        .arg(&out)
        .args(srcs.iter().filter(|s| s.ends_with(".c")))
        // log and expm1, for the sampling gaps and weights.
        .arg("-lm")
        // pthread keys and atfork (in libc from glibc 2.34 on).
        .arg("-pthread")
        .status()
        .with_context(|| format!("running the C compiler `{cc}` for {src} (set CC to another)"))?;
    if !status.success() {
        anyhow::bail!("`{cc}` failed to compile {src}");
    }
    Ok(())
}

fn build(features: &[&str]) -> anyhow::Result<()> {
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
    let toolchain = pinned_nightly(root.as_std_path())?;
    aya_build::build_ebpf(
        [Package {
            name: pkg.name.as_str(),
            root_dir: root.as_str(),
            features,
            ..Default::default()
        }],
        Toolchain::Custom(&toolchain),
    )
}

/// The `channel` of the eBPF crate's rust-toolchain.toml, checked to be
/// installed: aya-build's own error for a missing one does not say so.
fn pinned_nightly(ebpf_root: &std::path::Path) -> anyhow::Result<String> {
    let file = ebpf_root.join("rust-toolchain.toml");
    println!("cargo:rerun-if-changed={}", file.display());
    let text = std::fs::read_to_string(&file).with_context(|| format!("{}", file.display()))?;
    let channel = text
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "channel").then(|| v.trim().trim_matches('"').to_string())
        })
        .ok_or_else(|| anyhow!("no channel in {}", file.display()))?;
    let installed = std::process::Command::new("rustup")
        .args(["run", &channel, "rustc", "-V"])
        .env("RUSTUP_AUTO_INSTALL", "0")
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        anyhow::bail!(
            "toolchain {channel} (the eBPF build's pin) is not installed: run `cargo xtask setup`"
        );
    }
    Ok(channel)
}
