/* What the shim's two files share (memtrace_preload.c: the allocator
 * wrappers; compose.c: the ways a program reaches past a preload). */
#ifndef MEMTRACE_SHIM_H
#define MEMTRACE_SHIM_H

typedef void *(*dlsym_fn)(void *, const char *);

/* glibc's dlsym, found past the shim (NULL before glibc 2.34 when the
 * program did not load libdl). */
dlsym_fn memtrace_real_dlsym(void);

/* frees.c: queues a followed block's free for a batch report (1), or
 * says it must be reported on its own (0); and reports every thread's. */
int memtrace_batched_free(void *p);
void memtrace_flush_all(void);

/* The probe sites' first instruction: a nop the kernel emulates or
 * simulates, never single-steps. On x86_64 a 4-byte one: Linux 6.18 turns
 * a 5-byte nop into a call into a trampoline, and a process forked after
 * that crashes at the site (reproduced with bpftrace on a plain program).
 * The asm also keeps the calls. */
#if defined(__x86_64__)
#define NOP __asm__ volatile(".byte 0x0f, 0x1f, 0x40, 0x00" ::: "memory")
#elif defined(__aarch64__)
#define NOP __asm__ volatile("nop" ::: "memory")
#else
#error "the shim's probe sites are written for x86_64 and aarch64"
#endif

#endif
