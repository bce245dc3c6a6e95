use which::which;

/// Fails early, with the fix, when bpf-linker is missing: cargo's own error
/// ("linker `bpf-linker` not found") does not say how to install it.
fn main() {
    if which("bpf-linker").is_err() {
        panic!("bpf-linker not found: run `cargo xtask setup` (or `cargo xtask test`)");
    }
    println!("cargo:rerun-if-changed=build.rs");
    // aya-build sets it from the target memtrace is built for.
    println!("cargo::rustc-check-cfg=cfg(bpf_target_arch, values(\"x86_64\", \"aarch64\"))");
}
