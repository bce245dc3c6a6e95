/* Frees in batches (every call followed, no sampling): a free site per
 * call was a trap per free, about 40% of what an exact malloc/free pair
 * cost. Each thread keeps up to BATCH freed addresses with the time of
 * each free (CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns) and reports
 * them at one site when the batch is full, when its oldest is STALE_NS
 * old at the thread's next free, at the thread's exit, at the process's
 * exit (every thread's; also, in the kernel, at a thread's exit that runs
 * no destructor), before a report (memtrace calls memtrace_flush_all in
 * the processes, held still), and when memtrace takes its shim out of a
 * running process. The kernel applies a free only to a block
 * allocated before it: an address freed here and handed out again (by this
 * thread or another) before the batch is reported keeps its new block,
 * and the new allocation already released the old one.
 *
 * Batches are mapped, not in TLS: a shim loaded into a running process
 * (dlopen) has little static TLS to take. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

#define EXPORT __attribute__((visibility("default")))
#define SITE __attribute__((noinline, used)) EXPORT
#define UNUSED __attribute__((unused))

/* memtrace-common's memleak::FREE_BATCH. */
#define BATCH 64
#define STALE_NS 100000000ull
#define THREADS 4096

struct entry {
  uint64_t p, ts;
};
struct batch {
  _Atomic uint32_t n;
  uint32_t slot;
  uint64_t first;
  struct entry e[BATCH];
  uint32_t tid;
};

/* `n` frees at `e` (an array of {address, time}). */
SITE void memtrace_frees_site(UNUSED struct entry *e, UNUSED unsigned long n) { NOP; }
/* Thread `tid`'s batch (NULL: none any more): memtrace keeps it by
 * thread, and reports what is left in it when the thread exits without
 * the shim's help (_exit, a signal), where the kernel's exit tracepoint
 * still sees the process's memory (Linux 6.18 here; 6.1 and 6.12 free it
 * first, and such frees are counted as failed reads). */
SITE void memtrace_batch_site(UNUSED struct batch *b, UNUSED unsigned long tid) { NOP; }

static void flush(struct batch *b);

static void done_with(struct batch *b) {
  flush(b);
  memtrace_batch_site(NULL, b->tid);
}

static struct batch *_Atomic all[THREADS];
static __thread struct batch *mine __attribute__((tls_model("initial-exec")));
/* This thread got no batch (no slot, no memory): per-call sites. */
static __thread int unbatched __attribute__((tls_model("initial-exec")));
static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void flush(struct batch *b) {
  uint32_t n = atomic_load_explicit(&b->n, memory_order_acquire);
  if (n)
    memtrace_frees_site(b->e, n);
  atomic_store_explicit(&b->n, 0, memory_order_release);
}

/* A thread's exit: its frees, then its batch let go. */
static void gone(void *v) {
  struct batch *b = v;
  done_with(b);
  atomic_store(&all[b->slot], NULL);
  mine = NULL;
  unbatched = 1;
  syscall(SYS_munmap, b, sizeof *b);
}

/* A forked child: the other threads' batches and this one's pending
 * frees are the parent's, which reports its own copies. */
static void forked(void) {
  for (int i = 0; i < THREADS; i++) {
    struct batch *b = atomic_load_explicit(&all[i], memory_order_relaxed);
    if (b && b != mine)
      atomic_store_explicit(&all[i], NULL, memory_order_relaxed);
  }
  if (mine) {
    atomic_store_explicit(&mine->n, 0, memory_order_relaxed);
    mine->tid = (uint32_t)syscall(SYS_gettid);
    memtrace_batch_site(mine, mine->tid);
  }
}

static void setup(void) {
  pthread_key_create(&key, gone);
  pthread_atfork(NULL, NULL, forked);
}

static struct batch *get(void) {
  pthread_once(&once, setup);
  struct batch *b = (void *)syscall(SYS_mmap, NULL, sizeof *b, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (b != MAP_FAILED) {
    for (uint32_t i = 0; i < THREADS; i++) {
      struct batch *none = NULL;
      if (atomic_compare_exchange_strong(&all[i], &none, b)) {
        b->slot = i;
        mine = b;
        pthread_setspecific(key, b);
        b->tid = (uint32_t)syscall(SYS_gettid);
        memtrace_batch_site(b, b->tid);
        return b;
      }
    }
    syscall(SYS_munmap, b, sizeof *b);
  }
  unbatched = 1;
  return NULL;
}

int memtrace_batched_free(void *p) {
  struct batch *b = mine;
  if (__builtin_expect(!b, 0)) {
    if (unbatched || !(b = get()))
      return 0;
  }
  uint64_t t = now_ns();
  uint32_t n = atomic_load_explicit(&b->n, memory_order_relaxed);
  if (n == 0)
    b->first = t;
  b->e[n].p = (uintptr_t)p;
  b->e[n].ts = t;
  atomic_store_explicit(&b->n, n + 1, memory_order_release);
  if (n + 1 == BATCH || t - b->first > STALE_NS)
    flush(b);
  return 1;
}

/* Every thread's pending frees (at exit, and called by memtrace in a
 * process it holds still before it takes the shim out), the batches no
 * longer memtrace's to report at a thread's exit. */
EXPORT void memtrace_flush_all(void) {
  for (int i = 0; i < THREADS; i++) {
    struct batch *b = atomic_load_explicit(&all[i], memory_order_acquire);
    if (b)
      done_with(b);
  }
}
