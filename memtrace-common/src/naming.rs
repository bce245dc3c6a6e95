//! How the eBPF object's programs, maps and globals are named for
//! userspace: each module declares its own with `names!`, beside the types
//! they hold, and `lib.rs`'s module list gathers them into `names`.
//!
//! The kernel crate declares them as statics and functions (aya's macros
//! take the Rust identifier as the name); userspace refers to them only
//! through these typed constants, so a global is always written with its own
//! type and a map read with its own key and value. A unit test in memtrace
//! checks both ways against the built object: every name here exists there,
//! and every program, map and global there is named here (a map missing from
//! these lists would otherwise keep its compiled size in every tool).

use core::marker::PhantomData;

/// How a map is sized when the object is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sizing {
    /// As compiled: every tool uses it (loss counters, per-CPU scratch).
    Compiled,
    /// One entry unless the tool sizes it: most maps serve one tool, and an
    /// unused map costs locked kernel memory and start-up time.
    OnDemand,
}

/// A map's name with its key and value types (`()` for maps userspace
/// never reads entry by entry: ring buffers, stack traces, scratch).
pub struct MapName<K, V> {
    pub name: &'static str,
    pub sizing: Sizing,
    _kv: PhantomData<fn() -> (K, V)>,
}

impl<K, V> MapName<K, V> {
    pub const fn new(name: &'static str, sizing: Sizing) -> Self {
        MapName {
            name,
            sizing,
            _kv: PhantomData,
        }
    }
}

impl<K, V> Clone for MapName<K, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K, V> Copy for MapName<K, V> {}

/// A global (`.rodata`/`.bss` variable set before load) with its type.
pub struct GlobalName<T> {
    pub name: &'static str,
    _t: PhantomData<fn() -> T>,
}

impl<T> GlobalName<T> {
    pub const fn new(name: &'static str) -> Self {
        GlobalName {
            name,
            _t: PhantomData,
        }
    }
}

impl<T> Clone for GlobalName<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for GlobalName<T> {}

/// A program in the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Prog(pub &'static str);

/// A module's names: its maps (key and value types, sizing), its globals
/// (type) and its programs (the kernel function's name), as a `names`
/// submodule (with any items given after them) and their lists in
/// `name_lists`. The types are the module's own or imported by it.
#[macro_export]
macro_rules! names {
    (
        maps { $($map:ident: $k:ty => $v:ty, $sizing:ident;)* }
        globals { $($global:ident: $t:ty;)* }
        progs { $($prog:ident = $fn:ident,)* }
        $($extra:item)*
    ) => {
        /// This module's programs, maps and globals in the eBPF object.
        pub mod names {
            #[allow(unused_imports)]
            use super::*;
            #[allow(unused_imports)]
            use $crate::naming::{GlobalName, MapName, Prog, Sizing};
            $(pub const $map: MapName<$k, $v> = MapName::new(stringify!($map), Sizing::$sizing);)*
            $(pub const $global: GlobalName<$t> = GlobalName::new(stringify!($global));)*
            $(pub const $prog: Prog = Prog(stringify!($fn));)*
            $($extra)*
        }

        /// This module's names, listed for the loader and its test (apart
        /// from `names`, which `names` of the crate re-exports whole).
        pub mod name_lists {
            use $crate::naming::{Prog, Sizing};
            pub const MAPS: &[(&str, Sizing)] = &[$((stringify!($map), Sizing::$sizing)),*];
            pub const GLOBALS: &[&str] = &[$(stringify!($global)),*];
            pub const PROGS: &[Prog] = &[$(super::names::$prog),*];
        }
    };
}

/// `aya::Pod` for a module's plain-data types (userspace reads and writes
/// them as map keys, values, globals and records).
#[macro_export]
macro_rules! pod {
    ($($t:ty),* $(,)?) => {
        #[cfg(feature = "user")]
        const _: () = {
            // SAFETY: repr(C) plain data, valid for any bit pattern.
            $(unsafe impl aya::Pod for $t {})*
        };
    };
}
