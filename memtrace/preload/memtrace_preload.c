/* memtrace's allocator shim for `memleak -c`, preloaded into the command.
 *
 * It forwards every allocator call to glibc (its __libc_* entry points) and
 * reports the calls memleak follows by calling a probe site: a function
 * that starts with a nop, where memtrace places a uprobe. The kernel
 * emulates a nop (no single-step), and one site call carries what an entry
 * and a return probe saw between them. Not the 5-byte nop that Linux 6.18
 * turns into a call into a trampoline: a process forked after that was
 * done crashes at the site (reproduced with bpftrace on a plain program). Under
 * sampling the decision is made here, per thread, so an allocation that is
 * not sampled costs a few instructions instead of a trap; the addresses
 * sampled are kept in a small table so that only their frees are reported.
 *
 * Built with frame pointers: at a site, the frame-pointer chain starts at
 * the wrapper's caller (the site itself is the one frame memleak drops).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

#define EXPORT __attribute__((visibility("default")))
#define SITE __attribute__((noinline, used)) EXPORT

/* What a site reports, beside the addresses (memtrace-common's origin). */
enum { ORIGIN_USER = 0, ORIGIN_MMAP = 1 };

/* The probe sites. Each begins with a 4-byte nop (emulated, never
 * optimized); the asm also keeps the calls. */
#define NOP __asm__ volatile(".byte 0x0f, 0x1f, 0x40, 0x00" ::: "memory")
#define UNUSED __attribute__((unused))
SITE void memtrace_alloc_site(UNUSED void *p, UNUSED size_t size, UNUSED void *old,
                              UNUSED unsigned long skipped, UNUSED unsigned long origin) {
  NOP;
}
SITE void memtrace_free_site(UNUSED void *p, UNUSED unsigned long origin) { NOP; }
SITE void memtrace_table_full_site(UNUSED void *p) { NOP; }
SITE void memtrace_hello_site(UNUSED unsigned long sample) { NOP; }



/* Inlined into each exported function, so that at a site the caller's
 * frame pointer is the exported function's: the next frame is its caller. */
#define INLINE static inline __attribute__((always_inline))

/* 0: not read yet; 1: every call; else the mean gap in bytes + 1. */
static unsigned long config;

INLINE unsigned long sample_bytes(void) {
  unsigned long c = __atomic_load_n(&config, __ATOMIC_RELAXED);
  if (c == 0) {
    const char *s = getenv("MEMTRACE_PRELOAD_SAMPLE");
    unsigned long n = s ? strtoul(s, NULL, 10) : 0;
    c = n + 1;
    __atomic_store_n(&config, c, __ATOMIC_RELAXED);
  }
  return c - 1;
}

__attribute__((constructor)) static void hello(void) { memtrace_hello_site(sample_bytes()); }

/* Per thread: bytes left before the next sample, allocations not sampled
 * since the last one (reported with it), and a random state. */
static __thread long left __attribute__((tls_model("initial-exec")));
static __thread unsigned long skipped __attribute__((tls_model("initial-exec")));
static __thread uint64_t rng __attribute__((tls_model("initial-exec")));

/* The next gap: uniform in [0, 2N), mean N, as the kernel side draws it. */
static long gap(unsigned long n) {
  if (rng == 0)
    rng = (uintptr_t)&rng ^ __builtin_ia32_rdtsc() ^ 0x9e3779b97f4a7c15ull;
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (long)(rng % (2 * n));
}

/* Addresses sampled and not yet freed: buckets of one cache line, an
 * address in the bucket of its hash. A full bucket drops the sample (and
 * says so through a site), so no free of a reported block goes unseen. */
#define BUCKETS 8192
#define WAYS 8
static _Atomic uintptr_t sampled[BUCKETS][WAYS] __attribute__((aligned(64)));

static _Atomic uintptr_t *bucket(uintptr_t p) {
  return sampled[(p >> 4) * 0x9e3779b97f4a7c15ull >> 51];
}

static int remember(uintptr_t p) {
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

static int forget(uintptr_t p) {
  _Atomic uintptr_t *b = bucket(p);
  for (int i = 0; i < WAYS; i++) {
    uintptr_t q = p;
    if (atomic_load_explicit(&b[i], memory_order_relaxed) == p &&
        atomic_compare_exchange_strong(&b[i], &q, 0))
      return 1;
  }
  return 0;
}

/* Whether an allocation of `size` is reported: always when exact. */
INLINE int take(size_t size) {
  unsigned long n = sample_bytes();
  if (n == 0)
    return 1;
  left -= (long)size;
  if (left >= 0) {
    skipped++;
    return 0;
  }
  left = gap(n);
  return 1;
}

/* A new block (and the old one it replaces), reported if taken. */
INLINE void allocated(void *p, size_t size, void *old_reported) {
  int sampling = sample_bytes() != 0;
  int report = p && take(size) && (!sampling || remember((uintptr_t)p));
  if (report || old_reported) {
    memtrace_alloc_site(report ? p : NULL, size, old_reported, skipped, ORIGIN_USER);
    skipped = 0;
  }
}

/* Before a block goes back to glibc: reported if followed. Returns it when
 * it was, for realloc. */
INLINE void *releasing(void *p) {
  if (!p)
    return NULL;
  if (sample_bytes() != 0 && !forget((uintptr_t)p))
    return NULL;
  return p;
}

EXPORT void *malloc(size_t n) {
  void *p = __libc_malloc(n);
  allocated(p, n, NULL);
  return p;
}

EXPORT void free(void *p) {
  if (releasing(p))
    memtrace_free_site(p, ORIGIN_USER);
  __libc_free(p);
}

EXPORT void *calloc(size_t n, size_t size) {
  void *p = __libc_calloc(n, size);
  size_t bytes;
  if (__builtin_mul_overflow(n, size, &bytes))
    bytes = SIZE_MAX;
  allocated(p, bytes, NULL);
  return p;
}

INLINE void *resize(void *old, size_t n) {
  void *followed = releasing(old);
  void *p = __libc_realloc(old, n);
  if (!p && n != 0 && old) {
    /* Failed: the old block is still there. */
    if (followed && sample_bytes() != 0)
      remember((uintptr_t)old);
    return p;
  }
  allocated(p, n, followed);
  return p;
}

EXPORT void *realloc(void *old, size_t n) { return resize(old, n); }

EXPORT void *reallocarray(void *old, size_t n, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(n, size, &bytes)) {
    errno = ENOMEM;
    return NULL;
  }
  return resize(old, bytes);
}

INLINE void *aligned(size_t align, size_t n) {
  void *p = __libc_memalign(align, n);
  allocated(p, n, NULL);
  return p;
}

EXPORT void *memalign(size_t align, size_t n) { return aligned(align, n); }
EXPORT void *aligned_alloc(size_t align, size_t n) { return aligned(align, n); }

EXPORT int posix_memalign(void **out, size_t align, size_t n) {
  if (align % sizeof(void *) != 0 || (align & (align - 1)) != 0 || align == 0)
    return EINVAL;
  void *p = __libc_memalign(align, n);
  if (!p)
    return ENOMEM;
  allocated(p, n, NULL);
  *out = p;
  return 0;
}

EXPORT void *valloc(size_t n) {
  void *p = __libc_valloc(n);
  allocated(p, n, NULL);
  return p;
}

EXPORT void *pvalloc(size_t n) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  void *p = __libc_pvalloc(n);
  allocated(p, (n + page - 1) / page * page, NULL);
  return p;
}

/* Anonymous mmaps made through the PLT (by the program and its libraries,
 * not by glibc's allocator, whose own mmaps are its blocks): every one is
 * reported, and the kernel side samples them as it does without the shim. */
INLINE void *mapped(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  void *p = (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
  if (p != MAP_FAILED && (flags & MAP_ANONYMOUS))
    memtrace_alloc_site(p, len, NULL, 0, ORIGIN_MMAP);
  return p;
}

EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  return mapped(addr, len, prot, flags, fd, off);
}
EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  return mapped(addr, len, prot, flags, fd, off);
}

EXPORT int munmap(void *addr, size_t len) {
  memtrace_free_site(addr, ORIGIN_MMAP);
  return (int)syscall(SYS_munmap, addr, len);
}
