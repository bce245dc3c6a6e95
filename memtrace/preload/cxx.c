/* C++'s operator new and delete, every variant (plain, array, nothrow,
 * sized, aligned), through the shim's malloc and free: an allocator that
 * defines them itself (jemalloc, tcmalloc) serves them without calling its
 * malloc, and those blocks were never seen. A new is a malloc (an aligned
 * one a posix_memalign) of the allocator the shim forwards to, as
 * libstdc++'s is; only when that fails does the next operator new run, for
 * the new-handler and the exception (its block, under memory exhaustion,
 * is not reported). A delete is a free. A program that defines them itself
 * keeps its own (it comes before any preload). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

#include "shim.h"

#define EXPORT __attribute__((visibility("default")))

static void *next_fn(const char *name) {
  dlsym_fn dl = memtrace_real_dlsym();
  return dl ? dl(RTLD_NEXT, name) : NULL;
}

#define NEW(name)                                                                                  \
  EXPORT void *name(size_t n) {                                                                    \
    void *p = malloc(n);                                                                           \
    if (__builtin_expect(!p, 0)) {                                                                 \
      void *(*f)(size_t) = next_fn(#name);                                                         \
      p = f ? f(n) : NULL;                                                                         \
    }                                                                                              \
    return p;                                                                                      \
  }
#define NEW_NOTHROW(name)                                                                          \
  EXPORT void *name(size_t n, const void *nt) {                                                    \
    void *p = malloc(n);                                                                           \
    if (__builtin_expect(!p, 0)) {                                                                 \
      void *(*f)(size_t, const void *) = next_fn(#name);                                           \
      p = f ? f(n, nt) : NULL;                                                                     \
    }                                                                                              \
    return p;                                                                                      \
  }
/* Aligned: posix_memalign wants a multiple of the pointer size. */
#define ALIGNED(a) ((a) < sizeof(void *) ? sizeof(void *) : (a))
#define NEW_ALIGNED(name)                                                                          \
  EXPORT void *name(size_t n, size_t align) {                                                      \
    void *p = NULL;                                                                                \
    if (posix_memalign(&p, ALIGNED(align), n) != 0) {                                              \
      void *(*f)(size_t, size_t) = next_fn(#name);                                                 \
      p = f ? f(n, align) : NULL;                                                                  \
    }                                                                                              \
    return p;                                                                                      \
  }
#define NEW_ALIGNED_NOTHROW(name)                                                                  \
  EXPORT void *name(size_t n, size_t align, const void *nt) {                                      \
    void *p = NULL;                                                                                \
    if (posix_memalign(&p, ALIGNED(align), n) != 0) {                                              \
      void *(*f)(size_t, size_t, const void *) = next_fn(#name);                                   \
      p = f ? f(n, align, nt) : NULL;                                                              \
    }                                                                                              \
    return p;                                                                                      \
  }
#define DELETE(name, ...)                                                                          \
  EXPORT void name(void *p, ##__VA_ARGS__) { free(p); }

NEW(_Znwm)
NEW(_Znam)
NEW_NOTHROW(_ZnwmRKSt9nothrow_t)
NEW_NOTHROW(_ZnamRKSt9nothrow_t)
NEW_ALIGNED(_ZnwmSt11align_val_t)
NEW_ALIGNED(_ZnamSt11align_val_t)
NEW_ALIGNED_NOTHROW(_ZnwmSt11align_val_tRKSt9nothrow_t)
NEW_ALIGNED_NOTHROW(_ZnamSt11align_val_tRKSt9nothrow_t)

#define UNUSED __attribute__((unused))
DELETE(_ZdlPv)
DELETE(_ZdaPv)
DELETE(_ZdlPvm, UNUSED size_t n)
DELETE(_ZdaPvm, UNUSED size_t n)
DELETE(_ZdlPvRKSt9nothrow_t, UNUSED const void *nt)
DELETE(_ZdaPvRKSt9nothrow_t, UNUSED const void *nt)
DELETE(_ZdlPvSt11align_val_t, UNUSED size_t a)
DELETE(_ZdaPvSt11align_val_t, UNUSED size_t a)
DELETE(_ZdlPvmSt11align_val_t, UNUSED size_t n, UNUSED size_t a)
DELETE(_ZdaPvmSt11align_val_t, UNUSED size_t n, UNUSED size_t a)
DELETE(_ZdlPvSt11align_val_tRKSt9nothrow_t, UNUSED size_t a, UNUSED const void *nt)
DELETE(_ZdaPvSt11align_val_tRKSt9nothrow_t, UNUSED size_t a, UNUSED const void *nt)
