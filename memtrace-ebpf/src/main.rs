//! memtrace's kernel programs. One module per tool; `helpers` holds what they share.
#![no_std]
#![no_main]
// An atomic add (`helpers/atomic.rs`): core's atomic types have no
// read-modify-write on the BPF target.
#![allow(internal_features)]
#![feature(core_intrinsics)]

#[macro_use]
mod helpers;

mod brk;
mod compact;
mod faults;
mod ffaults;
mod generic;
mod memcg;
mod memleak;
mod mmapsnoop;
mod oomkill;
mod reclaim;
mod rss;
mod shmsnoop;
mod swapin;
mod top;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic; this is never called.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
