/* The probe sites memleak puts its uprobes on, each a function that starts
 * with a nop (shim.h). The two hot ones (an allocation; a free reported on
 * its own) come in generations of 5-byte-nop sites, which Linux 6.17 on
 * rewrites into a call into a per-process trampoline at their first hit:
 * a system call instead of a trap, about 100 ns less a call on this 6.18
 * host. The rewritten call is copied into a forked child and the
 * trampoline is not, so a child must never run a site its ancestors ran:
 * a fork empties a MADV_WIPEONFORK page, and the first call that finds it
 * empty moves the process to the next generation, whose sites no ancestor
 * can have run (a sibling's runs are in its own memory). Past the last
 * generation, and where the page cannot be had (before Linux 4.14), the
 * 4-byte-nop sites, which the kernel never rewrites. */
#define _GNU_SOURCE
#include <stddef.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

#define EXPORT __attribute__((visibility("default")))
#define SITE __attribute__((noinline, used)) EXPORT
#define UNUSED __attribute__((unused))

#define ALLOC_SITE(name, nop)                                                                      \
  SITE void name(UNUSED void *p, UNUSED size_t size, UNUSED void *old,                             \
                 UNUSED unsigned long skipped, UNUSED unsigned long origin,                        \
                 UNUSED unsigned long weight) {                                                    \
    nop;                                                                                           \
  }
#define FREE_SITE(name, nop)                                                                       \
  SITE void name(UNUSED void *p, UNUSED unsigned long origin, UNUSED unsigned long skipped) {      \
    nop;                                                                                           \
  }

/* memtrace-common's memleak::SITE_GENERATIONS names them for the probes. */
ALLOC_SITE(memtrace_alloc_site_0, NOP5)
ALLOC_SITE(memtrace_alloc_site_1, NOP5)
ALLOC_SITE(memtrace_alloc_site_2, NOP5)
ALLOC_SITE(memtrace_alloc_site_3, NOP5)
ALLOC_SITE(memtrace_alloc_site_4, NOP5)
ALLOC_SITE(memtrace_alloc_site_5, NOP5)
ALLOC_SITE(memtrace_alloc_site_6, NOP5)
ALLOC_SITE(memtrace_alloc_site_7, NOP5)
ALLOC_SITE(memtrace_alloc_site, NOP)
FREE_SITE(memtrace_free_site_0, NOP5)
FREE_SITE(memtrace_free_site_1, NOP5)
FREE_SITE(memtrace_free_site_2, NOP5)
FREE_SITE(memtrace_free_site_3, NOP5)
FREE_SITE(memtrace_free_site_4, NOP5)
FREE_SITE(memtrace_free_site_5, NOP5)
FREE_SITE(memtrace_free_site_6, NOP5)
FREE_SITE(memtrace_free_site_7, NOP5)
FREE_SITE(memtrace_free_site, NOP)

alloc_site_fn *const memtrace_alloc_sites[SITE_GENS + 1] = {
    memtrace_alloc_site_0, memtrace_alloc_site_1, memtrace_alloc_site_2,
    memtrace_alloc_site_3, memtrace_alloc_site_4, memtrace_alloc_site_5,
    memtrace_alloc_site_6, memtrace_alloc_site_7, memtrace_alloc_site,
};
free_site_fn *const memtrace_free_sites[SITE_GENS + 1] = {
    memtrace_free_site_0, memtrace_free_site_1, memtrace_free_site_2,
    memtrace_free_site_3, memtrace_free_site_4, memtrace_free_site_5,
    memtrace_free_site_6, memtrace_free_site_7, memtrace_free_site,
};

/* Until the page is set up (calls before the shim's constructor), and
 * without one: the last generation. */
static const char always = 1;
const volatile char *memtrace_alive = &always;
unsigned memtrace_site_gen = SITE_GENS;

void memtrace_sites_init(void) {
  /* By system call: the shim's own mmap would report the page. */
  long size = sysconf(_SC_PAGESIZE);
  char *page = (char *)syscall(SYS_mmap, NULL, size, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED)
    return;
  if (madvise(page, (size_t)size, MADV_WIPEONFORK) != 0) {
    syscall(SYS_munmap, page, size);
    return;
  }
  *page = 1;
  __atomic_store_n(&memtrace_site_gen, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&memtrace_alive, page, __ATOMIC_RELEASE);
}

/* The first call in a forked child (the child has one thread then). */
void memtrace_sites_forked(void) {
  unsigned g = __atomic_load_n(&memtrace_site_gen, __ATOMIC_RELAXED);
  if (g < SITE_GENS)
    __atomic_store_n(&memtrace_site_gen, g + 1, __ATOMIC_RELAXED);
  *(volatile char *)memtrace_alive = 1;
  memtrace_batches_forked();
}
