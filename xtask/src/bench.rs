//! `cargo xtask bench`: filled in below.
use anyhow::Result;

pub fn run(_runs: usize) -> Result<()> {
    anyhow::bail!("bench: not built yet")
}
