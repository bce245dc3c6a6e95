//! What a tool's `prepare` sets before the object is loaded: globals and
//! map sizes through the loader, with kernel facts read on demand.

use aya::Pod;
use memtrace_common::names::GlobalName;

use super::attach::Method;
use super::Loader;
use crate::error::Result;
use crate::kernel::{Format, KernelBtf};

/// What `Tool::prepare` can use: the loader, and kernel facts read on demand.
pub struct Prep<'a> {
    pub loader: &'a mut Loader,
    /// The process traced (`-p`, or the `-c` command), if any.
    pub target: Option<u32>,
    /// The attach method forced by `--attach`, if any.
    pub forced: Option<Method>,
    /// How stacks are taken (`memtrace_common::stack_mode` bits).
    pub stacks: u32,
}

impl Prep<'_> {
    pub fn btf(&self) -> Result<&'static KernelBtf> {
        KernelBtf::shared()
    }

    /// The task/mm/cgroup offsets, set as the `TASK` global; an error naming
    /// what is missing when kernel BTF lacks any of them.
    pub fn task_offsets(&mut self) -> Result<()> {
        let t = self.btf()?.task_offsets()?;
        self.loader.global(memtrace_common::names::TASK, &t);
        Ok(())
    }

    pub fn format(&self, cat: &str, name: &str) -> Result<Format> {
        Format::load(cat, name)
    }

    pub fn global<T: Pod>(&mut self, g: GlobalName<T>, v: &T) {
        self.loader.global(g, v);
    }
}
