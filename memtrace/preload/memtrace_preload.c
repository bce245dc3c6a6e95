/* memtrace's allocator shim for `memleak -c`, preloaded into the command.
 *
 * It forwards every allocator call to the allocator the program would use
 * without it (glibc's, through its __libc_* entry points, unless another
 * is loaded: below) and
 * reports the calls memleak follows by calling a probe site: a function
 * that starts with a nop, where memtrace places a uprobe. The kernel
 * emulates a nop (no single-step), or on Linux 6.17 on enters by a system
 * call instead of a trap (sites.c), and one site call carries what an entry
 * and a return probe saw between them. Under
 * sampling the decision is made here, per thread, so an allocation that is
 * not sampled costs a few instructions instead of a trap; the addresses
 * sampled are kept in a small table so that only their frees are reported.
 *
 * Built with frame pointers: at a site, the frame-pointer chain starts at
 * the wrapper's caller (the site itself is the one frame memleak drops).
 *
 * A program that brings its own allocator (jemalloc, tcmalloc, mimalloc
 * loaded before glibc) keeps it: the shim forwards to the definitions that
 * come after it (dlsym RTLD_NEXT), which are glibc's only where nothing
 * else defines them. Forwarding to glibc regardless handed the program
 * glibc's blocks and its allocator's other functions (malloc_usable_size,
 * mallctl) jemalloc's: redis-server crashed at start.
 *
 * compose.c closes the ways a program reaches past a preload (dlsym in a
 * library's handle, exec with an environment of its own).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

#include "shim.h"

#define EXPORT __attribute__((visibility("default")))
#define SITE __attribute__((noinline, used)) EXPORT

/* What a site reports, beside the addresses (memtrace-common's origin),
 * and above KIND_SHIFT which function called it (for the memo). */
enum { ORIGIN_USER = 0, ORIGIN_MMAP = 1 };
enum {
  KIND_MALLOC = 1,
  KIND_CALLOC,
  KIND_REALLOC,
  KIND_REALLOCARRAY,
  KIND_MEMALIGN,
  KIND_ALIGNED_ALLOC,
  KIND_POSIX_MEMALIGN,
  KIND_VALLOC,
  KIND_PVALLOC,
};

/* The probe sites (sites.c has the hot ones). Each begins with shim.h's NOP. */
#define UNUSED __attribute__((unused))
/* `lost`: 0 when the shim starts in a process; 1 for an exec of a child
 * that will not preload it (its environment dropped LD_PRELOAD). */
SITE void memtrace_hello_site(UNUSED unsigned long sample, UNUSED unsigned long lost) { NOP; }



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

__attribute__((constructor)) static void hello(void) {
  memtrace_sites_init();
  memtrace_memo_init(getenv("MEMTRACE_PRELOAD_SAMPLE"));
  memtrace_hello_site(sample_bytes(), 0);
}

void memtrace_exec_unpreloaded(void) { memtrace_hello_site(sample_bytes(), 1); }

/* Per thread: bytes left before the next sample, allocations not sampled
 * since the last report of them (with a free), and a random state (0 until
 * the thread's first allocation draws its first gap). */
static __thread long left __attribute__((tls_model("initial-exec")));
static __thread unsigned long skipped __attribute__((tls_model("initial-exec")));
static __thread uint64_t rng __attribute__((tls_model("initial-exec")));

/* The next gap in bytes: exponential with mean N (-N ln U, U in (0, 1]),
 * as tcmalloc and jemalloc draw it. Memoryless, so an allocation of s bytes
 * is sampled with probability 1 - e^(-s/N) whatever came before it. */
static long gap(unsigned long n) {
  if (rng == 0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    rng = (uintptr_t)&rng ^ ((uint64_t)t.tv_sec * 1000000000u + t.tv_nsec) ^ 0x9e3779b97f4a7c15ull;
  }
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  double u = (double)((rng >> 11) + 1) * 0x1p-53;
  return (long)(-(double)n * log(u));
}

/* What a sample of `size` stands for, in allocations, fixed point 1/65536:
 * 1 / (1 - e^(-size/N)), the inverse of its chance (unbiased); the kernel
 * side weighs its bytes as size times this. */
static unsigned long weight(size_t size, unsigned long n) {
  return (unsigned long)(65536.0 / -expm1(-(double)size / (double)n) + 0.5);
}

/* At exit: the allocations the exiting thread's sampling passed over and
 * never reported (a process none of whose calls was sampled still shows
 * its calls were seen). */
__attribute__((destructor)) static void bye(void) {
  memtrace_flush_all();
  if (skipped)
    FREE_SITE_CALL(NULL, ORIGIN_USER, skipped);
  skipped = 0;
}

/* The allocator calls go to, glibc's until another is found. */
static void *libc_aligned_alloc(size_t align, size_t n) { return __libc_memalign(align, n); }
static int libc_posix_memalign(void **out, size_t align, size_t n) {
  if (align % sizeof(void *) != 0 || (align & (align - 1)) != 0 || align == 0)
    return EINVAL;
  void *p = __libc_memalign(align, n);
  if (!p)
    return ENOMEM;
  *out = p;
  return 0;
}
static struct {
  void *(*malloc)(size_t);
  void (*free)(void *);
  void *(*calloc)(size_t, size_t);
  void *(*realloc)(void *, size_t);
  void *(*memalign)(size_t, size_t);
  void *(*aligned_alloc)(size_t, size_t);
  int (*posix_memalign)(void **, size_t, size_t);
  void *(*valloc)(size_t);
  void *(*pvalloc)(size_t);
} next = {__libc_malloc,      __libc_free,         __libc_calloc,
          __libc_realloc,     __libc_memalign,     libc_aligned_alloc,
          libc_posix_memalign, __libc_valloc,       __libc_pvalloc};
static _Atomic int resolved;
/* Inside the allocator, on this thread: its own mmaps are its blocks'. */
static __thread int in_alloc __attribute__((tls_model("initial-exec")));

/* Forward to what `handle` finds, function by function (glibc's where it
 * finds none). */
static void forward_to(dlsym_fn dl, void *handle) {
#define NEXT(f)                                                                                    \
  do {                                                                                             \
    void *s = dl(handle, #f);                                                                      \
    if (s)                                                                                         \
      __builtin_memcpy(&next.f, &s, sizeof s);                                                     \
  } while (0)
  NEXT(malloc);
  NEXT(free);
  NEXT(calloc);
  NEXT(realloc);
  NEXT(memalign);
  NEXT(aligned_alloc);
  NEXT(posix_memalign);
  NEXT(valloc);
  NEXT(pvalloc);
#undef NEXT
}

static __attribute__((noinline)) void resolve_slow(void) {
  static __thread int busy __attribute__((tls_model("initial-exec")));
  if (busy)
    return; /* dlsym's own calls (none when it succeeds) go to glibc */
  busy = 1;
  /* Before glibc 2.34 without libdl: glibc's, as the shim always did. */
  dlsym_fn dl = memtrace_real_dlsym();
  void *m = dl ? dl(RTLD_NEXT, "malloc") : NULL;
  if (m && m != (void *)__libc_malloc)
    forward_to(dl, RTLD_NEXT);
  atomic_store_explicit(&resolved, 1, memory_order_release);
  busy = 0;
}

/* `memleak -p`: memtrace loaded the shim into a running process (dlopen,
 * in a thread it stopped) and calls this before pointing the process's
 * allocator calls here. The calls go on to what the process's own
 * lookups find (its main program's search list, which the shim is not
 * in), not to RTLD_NEXT, which from a dlopen'd object is glibc's whatever
 * the process uses. 0, or -1 when no malloc is found. */
EXPORT int memtrace_injected(unsigned long sample) {
  __atomic_store_n(&config, sample + 1, __ATOMIC_RELAXED);
  dlsym_fn dl = memtrace_real_dlsym();
  void *prog = dl ? dlopen(NULL, RTLD_NOW | RTLD_NOLOAD) : NULL;
  if (!prog || !dl(prog, "malloc"))
    return -1;
  forward_to(dl, prog);
  atomic_store_explicit(&resolved, 1, memory_order_release);
  return 0;
}

INLINE void resolve(void) {
  if (__builtin_expect(!atomic_load_explicit(&resolved, memory_order_acquire), 0))
    resolve_slow();
}

/* A call to the allocator, on this thread's count of calls inside it. */
#define FORWARD(call)                                                                              \
  ({                                                                                               \
    resolve();                                                                                     \
    in_alloc++;                                                                                    \
    __typeof__(call) r_ = call;                                                                    \
    in_alloc--;                                                                                    \
    r_;                                                                                            \
  })

/* Whether an allocation of `size` is reported, and its weight (1 << 16
 * when exact). The thread's first gap is drawn like the others. */
INLINE int take(size_t size, unsigned long *w) {
  unsigned long n = sample_bytes();
  *w = 1ul << 16;
  if (n == 0)
    return 1;
  if (__builtin_expect(rng == 0, 0))
    left = gap(n);
  left -= (long)size;
  if (left >= 0) {
    skipped++;
    return 0;
  }
  left = gap(n);
  *w = weight(size, n);
  return 1;
}

/* A new block (and the old one it replaces), reported if taken. Not when
 * the allocator made the call itself (a realloc built on malloc and free,
 * which resolve to this shim): the outer call reports its result, and the
 * inner block counted too would stay outstanding under the inner stack.
 * Exact, with the memo: queued with the stack it gives, else the old
 * block goes in the batch (behind the allocations there) and the new one
 * traps. `kind`: the exported function this is inlined into, whose frame
 * is the frame address here. */
INLINE void allocated(void *p, size_t size, void *old_reported, unsigned kind) {
  if (in_alloc)
    return;
  int sampling = sample_bytes() != 0;
  if (!sampling && __atomic_load_n(&memtrace_memo_on, __ATOMIC_RELAXED)) {
    uintptr_t bp = (uintptr_t)__builtin_frame_address(0);
    if (p && memtrace_batched_alloc(p, size, old_reported, kind, bp))
      return;
    if (old_reported && memtrace_batched_free(old_reported))
      old_reported = NULL;
  }
  unsigned long w = 0;
  int report = p && take(size, &w) && (!sampling || memtrace_remember((uintptr_t)p));
  if (report || old_reported)
    ALLOC_SITE_CALL(report ? p : NULL, size, old_reported, skipped,
                    ORIGIN_USER | (unsigned long)kind << KIND_SHIFT, w);
}

/* Before a block goes back to glibc: reported if followed. Returns it when
 * it was, for realloc. */
INLINE void *releasing(void *p) {
  if (!p || in_alloc)
    return NULL;
  if (sample_bytes() != 0 && !memtrace_forget((uintptr_t)p))
    return NULL;
  return p;
}

EXPORT void *malloc(size_t n) {
  void *p = FORWARD(next.malloc(n));
  allocated(p, n, NULL, KIND_MALLOC);
  return p;
}

EXPORT void free(void *p) {
  /* Every call followed: in a batch (frees.c). Sampled: the rare sampled
   * block's free on its own, with the count passed over. */
  if (releasing(p) && (sample_bytes() != 0 || !memtrace_batched_free(p))) {
    FREE_SITE_CALL(p, ORIGIN_USER, skipped);
    skipped = 0;
  }
  FORWARD((next.free(p), 0));
}

EXPORT void *calloc(size_t n, size_t size) {
  void *p = FORWARD(next.calloc(n, size));
  size_t bytes;
  if (__builtin_mul_overflow(n, size, &bytes))
    bytes = SIZE_MAX;
  allocated(p, bytes, NULL, KIND_CALLOC);
  return p;
}

INLINE void *resize(void *old, size_t n, unsigned kind) {
  void *followed = releasing(old);
  void *p = FORWARD(next.realloc(old, n));
  if (!p && n != 0 && old) {
    /* Failed: the old block is still there. */
    if (followed && sample_bytes() != 0)
      memtrace_remember((uintptr_t)old);
    return p;
  }
  allocated(p, n, followed, kind);
  return p;
}

EXPORT void *realloc(void *old, size_t n) { return resize(old, n, KIND_REALLOC); }

EXPORT void *reallocarray(void *old, size_t n, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(n, size, &bytes)) {
    errno = ENOMEM;
    return NULL;
  }
  return resize(old, bytes, KIND_REALLOCARRAY);
}

EXPORT void *memalign(size_t align, size_t n) {
  void *p = FORWARD(next.memalign(align, n));
  allocated(p, n, NULL, KIND_MEMALIGN);
  return p;
}

EXPORT void *aligned_alloc(size_t align, size_t n) {
  void *p = FORWARD(next.aligned_alloc(align, n));
  allocated(p, n, NULL, KIND_ALIGNED_ALLOC);
  return p;
}

EXPORT int posix_memalign(void **out, size_t align, size_t n) {
  int e = FORWARD(next.posix_memalign(out, align, n));
  if (e == 0)
    allocated(*out, n, NULL, KIND_POSIX_MEMALIGN);
  return e;
}

EXPORT void *valloc(size_t n) {
  void *p = FORWARD(next.valloc(n));
  allocated(p, n, NULL, KIND_VALLOC);
  return p;
}

EXPORT void *pvalloc(size_t n) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  void *p = FORWARD(next.pvalloc(n));
  allocated(p, (n + page - 1) / page * page, NULL, KIND_PVALLOC);
  return p;
}

/* Anonymous mmaps made through the PLT (by the program and its libraries,
 * not by glibc's allocator, whose own mmaps are its blocks): every one is
 * reported, and the kernel side samples them as it does without the shim. */
INLINE void *mapped(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  void *p = (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
  if (p != MAP_FAILED && (flags & MAP_ANONYMOUS) && !in_alloc)
    ALLOC_SITE_CALL(p, len, NULL, 0, ORIGIN_MMAP, 1ul << 16);
  return p;
}

EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  return mapped(addr, len, prot, flags, fd, off);
}
EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  return mapped(addr, len, prot, flags, fd, off);
}

EXPORT int munmap(void *addr, size_t len) {
  if (!in_alloc)
    FREE_SITE_CALL(addr, ORIGIN_MMAP, 0);
  return (int)syscall(SYS_munmap, addr, len);
}
