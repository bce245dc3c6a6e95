/* An allocator of its own, as jemalloc or tcmalloc is to a program linked
 * with it: malloc and the rest, plus malloc_usable_size, which knows only
 * its own blocks (a 16-byte header with a magic word) and aborts on any
 * other, as a real allocator would crash on a block that is not its. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);

#define MAGIC 0x6f776e616c6c6f63ull

struct head {
  uint64_t magic;
  uint64_t size;
};

static unsigned long served;

static struct head *head_of(void *p) {
  struct head *h = (struct head *)p - 1;
  if (h->magic != MAGIC) {
    fputs("ownalloc: a block that is not mine\n", stderr);
    abort();
  }
  return h;
}

void *malloc(size_t n) {
  struct head *h = __libc_malloc(n + sizeof *h);
  if (!h)
    return NULL;
  h->magic = MAGIC;
  h->size = n;
  __atomic_add_fetch(&served, 1, __ATOMIC_RELAXED);
  return h + 1;
}

void free(void *p) {
  if (!p)
    return;
  struct head *h = head_of(p);
  h->magic = 0;
  __libc_free(h);
}

void *calloc(size_t n, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(n, size, &bytes))
    return NULL;
  void *p = malloc(bytes);
  if (p)
    memset(p, 0, bytes);
  return p;
}

void *realloc(void *old, size_t n) {
  if (!old)
    return malloc(n);
  if (n == 0) {
    free(old);
    return NULL;
  }
  size_t was = head_of(old)->size;
  void *p = malloc(n);
  if (p) {
    memcpy(p, old, was < n ? was : n);
    free(old);
  }
  return p;
}

size_t malloc_usable_size(void *p) { return p ? head_of(p)->size : 0; }

unsigned long ownalloc_served(void) { return served; }
