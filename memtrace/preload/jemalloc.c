/* jemalloc's own API (mallocx, rallocx, xallocx, dallocx, sdallocx),
 * through the shim's malloc, calloc, posix_memalign, realloc and free: a
 * program that calls it got jemalloc's blocks without a call the shim
 * saw. The blocks still come from the allocator the shim forwards to
 * (jemalloc, when the program uses it), without the arena and tcache
 * choices the flags may make. Defined whether or not jemalloc is loaded,
 * so a program that looks for them (a weak reference) gets working ones.
 *
 * Flags (jemalloc.h): the low 6 bits are lg(alignment), MALLOCX_ZERO is
 * 0x40. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define UNUSED __attribute__((unused))

#define LG_ALIGN_MASK 0x3f
#define MALLOCX_ZERO 0x40

/* The alignment the flags ask for beyond malloc's own (0: none). */
static size_t alignment(int flags) {
  size_t a = (flags & LG_ALIGN_MASK) ? (size_t)1 << (flags & LG_ALIGN_MASK) : 0;
  return a > 16 ? a : 0;
}

EXPORT void *mallocx(size_t size, int flags) {
  size_t a = alignment(flags);
  if (!a)
    return (flags & MALLOCX_ZERO) ? calloc(1, size) : malloc(size);
  void *p = NULL;
  if (posix_memalign(&p, a, size) != 0)
    return NULL;
  if (flags & MALLOCX_ZERO)
    memset(p, 0, size);
  return p;
}

EXPORT void *rallocx(void *ptr, size_t size, int flags) {
  size_t old = malloc_usable_size(ptr);
  if (!alignment(flags) && !(flags & MALLOCX_ZERO))
    return realloc(ptr, size);
  /* An alignment or zeroed growth realloc does not promise: a new block. */
  void *p = mallocx(size, flags);
  if (!p)
    return NULL;
  memcpy(p, ptr, old < size ? old : size);
  free(ptr);
  return p;
}

/* Resizing in place is jemalloc's to refuse: the size the block has. */
EXPORT size_t xallocx(void *ptr, UNUSED size_t size, UNUSED size_t extra, UNUSED int flags) {
  return malloc_usable_size(ptr);
}

EXPORT void dallocx(void *ptr, UNUSED int flags) { free(ptr); }

EXPORT void sdallocx(void *ptr, UNUSED size_t size, UNUSED int flags) { free(ptr); }
