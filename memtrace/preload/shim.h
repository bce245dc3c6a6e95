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

#endif
