//! What the running kernel offers: tracefs formats, BTF offsets, features.

pub mod bpfsys;
pub mod btf;
pub mod caps;
pub mod cgroupid;
pub mod feature;
pub mod grace;
pub mod mounts;
pub mod resolve;
pub mod tracefs;

pub use btf::KernelBtf;
pub use resolve::Resolve;
pub use tracefs::Format;
