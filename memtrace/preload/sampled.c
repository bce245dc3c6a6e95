/* The addresses sampled and not yet freed (`--sample-bytes`), so that only
 * their frees are reported. */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>

#include "shim.h"

#define EXPORT __attribute__((visibility("default")))
#define SITE __attribute__((noinline, used)) EXPORT
#define UNUSED __attribute__((unused))

/* The table had no room for a sampled block (memleak counts it lost). */
SITE void memtrace_table_full_site(UNUSED void *p) { NOP; }

/* Addresses sampled and not yet freed: buckets of one cache line, an
 * address in the bucket of its hash. A full bucket drops the sample (and
 * says so through a site), so no free of a reported block goes unseen. */
#define BUCKETS 8192
#define WAYS 8
static _Atomic uintptr_t sampled[BUCKETS][WAYS] __attribute__((aligned(64)));

static _Atomic uintptr_t *bucket(uintptr_t p) {
  return sampled[(p >> 4) * 0x9e3779b97f4a7c15ull >> 51];
}

int memtrace_remember(uintptr_t p) {
  _Atomic uintptr_t *b = bucket(p);
  for (int i = 0; i < WAYS; i++) {
    uintptr_t none = 0;
    if (atomic_load_explicit(&b[i], memory_order_relaxed) == 0 &&
        atomic_compare_exchange_strong(&b[i], &none, p))
      return 1;
  }
  memtrace_table_full_site((void *)p);
  return 0;
}

int memtrace_forget(uintptr_t p) {
  _Atomic uintptr_t *b = bucket(p);
  for (int i = 0; i < WAYS; i++) {
    uintptr_t q = p;
    if (atomic_load_explicit(&b[i], memory_order_relaxed) == p &&
        atomic_compare_exchange_strong(&b[i], &q, 0))
      return 1;
  }
  return 0;
}

