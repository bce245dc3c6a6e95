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

/// The ring buffer's size with counts keyed by image (`image_keys`).
const IMAGE_RING_BYTES: u32 = 1 << 20;

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

    /// Counts by stack keyed by image rather than by process (unless
    /// `per_pid`): `IMAGE` set. Where this kernel's BTF lacks an offset,
    /// counts stay keyed by process, as it says. Whether they are.
    pub fn image_keys(&mut self, per_pid: bool) -> bool {
        if per_pid {
            return false;
        }
        match self.btf().and_then(|b| b.image_offsets()) {
            Ok(o) => {
                self.loader.global(memtrace_common::names::IMAGE, &o);
                // Room for the records of which forked process took which
                // stack (32 bytes each) in a burst of forks: up to half of
                // it, the rest stays for the other records.
                let events = memtrace_common::names::EVENTS;
                if self
                    .loader
                    .size_of(events)
                    .is_none_or(|b| b < IMAGE_RING_BYTES)
                {
                    self.loader.max_entries(events, IMAGE_RING_BYTES);
                }
                true
            }
            Err(e) => {
                say!(
                    "memtrace: identical stacks of forked processes stay apart in the kernel: {e}"
                );
                false
            }
        }
    }

    pub fn format(&self, cat: &str, name: &str) -> Result<Format> {
        Format::load(cat, name)
    }

    pub fn global<T: Pod>(&mut self, g: GlobalName<T>, v: &T) {
        self.loader.global(g, v);
    }
}
