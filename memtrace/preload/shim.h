/* What the shim's two files share (memtrace_preload.c: the allocator
 * wrappers; compose.c: the ways a program reaches past a preload). */
#ifndef MEMTRACE_SHIM_H
#define MEMTRACE_SHIM_H

#include <stddef.h>
#include <stdint.h>

typedef void *(*dlsym_fn)(void *, const char *);

/* glibc's dlsym, found past the shim (NULL before glibc 2.34 when the
 * program did not load libdl). */
dlsym_fn memtrace_real_dlsym(void);

/* frees.c: queues a followed block's free for a batch report (1), or
 * says it must be reported on its own (0); and reports every thread's. */
int memtrace_batched_free(void *p);
void memtrace_flush_all(void);

/* sampled.c: a sampled block kept until its free (0: no room, said
 * through a site), and whether a block being freed was one. */
int memtrace_remember(uintptr_t p);
int memtrace_forget(uintptr_t p);

/* memo.c: the stacks the kernel program published for this process's
 * threads (memtrace-common's shim, whose constants these mirror). */
#define MEMO_SLOTS 2048
#define MEMO_WAYS 8
#define MEMO_READS 122
#define KIND_SHIFT 8
/* memtrace_preload.c: an exec whose environment dropped LD_PRELOAD. */
void memtrace_exec_unpreloaded(void);
extern int memtrace_memo_on;
void memtrace_memo_init(const char *config);
void memtrace_memo_drop(void);
int memtrace_memo_stack(uint32_t tid, uint32_t tgid, uintptr_t bp, uintptr_t site, unsigned kind,
                        uint64_t *stack);

/* frees.c: an allocation (and the block it replaces) queued with the stack
 * its memo gives (1), or not (0: it traps). */
int memtrace_batched_alloc(void *p, size_t size, void *old, unsigned kind, uintptr_t bp);
/* A forked child's batch, set right once (frees.c). */
void memtrace_batches_forked(void);

/* sites.c: the hot probe sites by generation (the last one never
 * rewritten), and the one this process may run. */
#define SITE_GENS 8
typedef void alloc_site_fn(void *p, size_t size, void *old, unsigned long skipped,
                           unsigned long origin, unsigned long weight);
typedef void free_site_fn(void *p, unsigned long origin, unsigned long skipped);
extern alloc_site_fn *const memtrace_alloc_sites[SITE_GENS + 1];
extern free_site_fn *const memtrace_free_sites[SITE_GENS + 1];
extern const volatile char *memtrace_alive;
extern unsigned memtrace_site_gen;
void memtrace_sites_init(void);
void memtrace_sites_forked(void);

/* This process's generation; inlined so that a site's caller stays the
 * exported function that called it. */
static inline __attribute__((always_inline)) unsigned memtrace_gen(void) {
  if (__builtin_expect(!*__atomic_load_n(&memtrace_alive, __ATOMIC_ACQUIRE), 0))
    memtrace_sites_forked();
  return __atomic_load_n(&memtrace_site_gen, __ATOMIC_RELAXED);
}
#define ALLOC_SITE_CALL(...) memtrace_alloc_sites[memtrace_gen()](__VA_ARGS__)
#define FREE_SITE_CALL(...) memtrace_free_sites[memtrace_gen()](__VA_ARGS__)

/* The probe sites' first instruction: a nop the kernel emulates or
 * simulates, never single-steps. NOP is never rewritten by the kernel. On
 * x86_64 NOP5 is the 5-byte nop that Linux 6.17 on turns, at the first
 * hit, into a call into a trampoline that enters the kernel by a system
 * call rather than a trap (about 100 ns less a call on this 6.18 host); a
 * process forked after that crashes at the site (the call is copied, the
 * trampoline is not: reproduced with bpftrace on a plain program), so the
 * sites with it come in generations (memtrace_preload.c). The asm also
 * keeps the calls. */
#if defined(__x86_64__)
#define NOP __asm__ volatile(".byte 0x0f, 0x1f, 0x40, 0x00" ::: "memory")
#define NOP5 __asm__ volatile(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00" ::: "memory")
#elif defined(__aarch64__)
#define NOP __asm__ volatile("nop" ::: "memory")
#define NOP5 NOP
#else
#error "the shim's probe sites are written for x86_64 and aarch64"
#endif

#endif
