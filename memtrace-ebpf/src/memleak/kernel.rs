//! Kernel mode: the kmem tracepoints, by kernel stack; tgid 0 for all.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use memtrace_common::memleak::{counter, origin};

use super::{admit, bump, record, release, KERNEL, MEMLEAK_CFG};
use crate::helpers::tp_field;

#[inline(always)]
fn kalloc(ctx: &TracePointContext, ptr_off: u32, size: u64, origin: u32) {
    let addr: u64 = tp_field(ctx, ptr_off);
    if addr == 0 {
        return;
    }
    if let Some(w) = admit(size) {
        record(ctx, KERNEL, 0, addr, size, origin, w);
    }
}

#[inline(always)]
fn kfree(ctx: &TracePointContext, ptr_off: u32, origin: u32) {
    let addr: u64 = tp_field(ctx, ptr_off);
    if addr != 0 && !release(KERNEL, 0, addr, origin) && MEMLEAK_CFG.load().sample_bytes == 0 {
        bump(counter::FREE_UNKNOWN);
    }
}

#[tracepoint]
pub fn ml_kmalloc(ctx: TracePointContext) -> u32 {
    let c = MEMLEAK_CFG.load();
    kalloc(
        &ctx,
        c.kmalloc_ptr,
        tp_field(&ctx, c.kmalloc_bytes),
        origin::SLAB,
    );
    0
}

#[tracepoint]
pub fn ml_cache_alloc(ctx: TracePointContext) -> u32 {
    let c = MEMLEAK_CFG.load();
    kalloc(
        &ctx,
        c.cache_alloc_ptr,
        tp_field(&ctx, c.cache_alloc_bytes),
        origin::SLAB,
    );
    0
}

#[tracepoint]
pub fn ml_kfree(ctx: TracePointContext) -> u32 {
    kfree(&ctx, MEMLEAK_CFG.load().kfree_ptr, origin::SLAB);
    0
}

#[tracepoint]
pub fn ml_cache_free(ctx: TracePointContext) -> u32 {
    kfree(&ctx, MEMLEAK_CFG.load().cache_free_ptr, origin::SLAB);
    0
}

#[tracepoint]
pub fn ml_page_alloc(ctx: TracePointContext) -> u32 {
    let c = MEMLEAK_CFG.load();
    let order: u32 = tp_field(&ctx, c.page_alloc_order);
    let size = (c.page_size as u64) << (order & 31);
    kalloc(&ctx, c.page_alloc_pfn, size, origin::PAGE);
    0
}

#[tracepoint]
pub fn ml_page_free(ctx: TracePointContext) -> u32 {
    kfree(&ctx, MEMLEAK_CFG.load().page_free_pfn, origin::PAGE);
    0
}

#[tracepoint]
pub fn ml_pcpu_alloc(ctx: TracePointContext) -> u32 {
    let c = MEMLEAK_CFG.load();
    kalloc(
        &ctx,
        c.pcpu_alloc_ptr,
        tp_field(&ctx, c.pcpu_alloc_bytes),
        origin::PERCPU,
    );
    0
}

#[tracepoint]
pub fn ml_pcpu_free(ctx: TracePointContext) -> u32 {
    kfree(&ctx, MEMLEAK_CFG.load().pcpu_free_ptr, origin::PERCPU);
    0
}
