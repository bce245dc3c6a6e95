/* Frees in batches (every call followed, no sampling): a free site per
 * call was a trap per free, about 40% of what an exact malloc/free pair
 * cost. Allocations whose stack the memo gives (memo.c) go in the same
 * batch, in order with the frees; a block freed while its allocation is
 * still in the batch leaves only its figures there (address 0, merged
 * with the entry before it when that is one from the same stack), so a
 * loop of allocations and frees from one place stays in the process. Each thread keeps up to BATCH freed addresses with the time of
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

/* memtrace-common's shim::BatchEntry: a free (stack 0; size 1 when other
 * threads have batches) or an allocation (stack | ALLOCATED); an
 * allocation freed in the batch has p 0 and counts `ts` blocks of `size`
 * bytes in all. */
struct entry {
  uint64_t p, ts, size, stack;
};
#define ALLOCATED (1ull << 63)
/* Entries a free looks back over for its block's allocation. */
#define LOOK_BACK 16
struct batch {
  _Atomic uint32_t n;
  uint32_t slot;
  uint64_t first;
  struct entry e[BATCH];
  uint32_t tid, tgid;
  struct batch *next; /* on the spare list */
};

/* `n` entries at `e`. */
#ifdef MEMTRACE_SHIM_TEST
void memtrace_test_frees(const struct entry *e, unsigned long n); /* test/shim_test.c */
#define TEST_FREES(e, n) memtrace_test_frees(e, n)
#else
#define TEST_FREES(e, n) ((void)0)
#endif
SITE void memtrace_frees_site(UNUSED struct entry *e, UNUSED unsigned long n) {
  NOP;
  TEST_FREES(e, n);
}
/* Thread `tid`'s batch (NULL: none any more): memtrace keeps it by
 * thread, and reports what is left in it when the thread exits without
 * the shim's help (_exit, a signal), where the kernel's exit tracepoint
 * still sees the process's memory (Linux 6.18 here; 6.1 and 6.12 free it
 * first, and such frees are counted as failed reads). */
SITE void memtrace_batch_site(UNUSED struct batch *b, UNUSED unsigned long tid) { NOP; }

/* Batches of threads gone, for threads to come: never unmapped, since
 * memtrace_flush_all at the process's exit may still be reading one that
 * it found in `all` just before its thread let it go. */
static struct batch *spare;
static atomic_flag spare_lock = ATOMIC_FLAG_INIT;

static void lock_spare(void) {
  while (atomic_flag_test_and_set_explicit(&spare_lock, memory_order_acquire))
    ;
}

static void flush(struct batch *b);

static void done_with(struct batch *b) {
  flush(b);
  memtrace_batch_site(NULL, b->tid);
}

/* Threads with a batch: past one, a block one frees may have its
 * allocation in another's batch still (its frees say so, for the kernel). */
static _Atomic int nbatches;

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
  atomic_fetch_sub(&nbatches, 1);
  atomic_store(&all[b->slot], NULL);
  mine = NULL;
  unbatched = 1;
  lock_spare();
  b->next = spare;
  spare = b;
  atomic_flag_clear_explicit(&spare_lock, memory_order_release);
}

/* A forked child: the other threads' batches and this one's pending
 * entries are the parent's, which reports its own copies. Run by the
 * child's first call into the shim (sites.c sees the fork) or by its
 * fork handler, whichever is first (another library's fork handler may
 * allocate before this one runs): once. */
void memtrace_batches_forked(void) {
  /* A thread that held it at the fork is not in the child. */
  atomic_flag_clear_explicit(&spare_lock, memory_order_relaxed);
  uint32_t me = (uint32_t)syscall(SYS_gettid);
  if (mine && mine->tid == me)
    return;
  for (int i = 0; i < THREADS; i++) {
    struct batch *b = atomic_load_explicit(&all[i], memory_order_relaxed);
    if (b && b != mine)
      atomic_store_explicit(&all[i], NULL, memory_order_relaxed);
  }
  atomic_store_explicit(&nbatches, mine ? 1 : 0, memory_order_relaxed);
  if (mine) {
    atomic_store_explicit(&mine->n, 0, memory_order_relaxed);
    mine->tid = me;
    mine->tgid = (uint32_t)getpid();
    memtrace_batch_site(mine, mine->tid);
  }
}

static void setup(void) {
  pthread_key_create(&key, gone);
  pthread_atfork(NULL, NULL, memtrace_batches_forked);
}

static struct batch *get(void) {
  pthread_once(&once, setup);
  lock_spare();
  struct batch *b = spare;
  if (b)
    spare = b->next;
  atomic_flag_clear_explicit(&spare_lock, memory_order_release);
  if (!b)
    b = (void *)syscall(SYS_mmap, NULL, sizeof *b, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (b != MAP_FAILED) {
    /* Its thread before it is seen in `all` (flush_all reads it). */
    atomic_store_explicit(&b->n, 0, memory_order_relaxed);
    b->tid = (uint32_t)syscall(SYS_gettid);
    b->tgid = (uint32_t)getpid();
    for (uint32_t i = 0; i < THREADS; i++) {
      struct batch *none = NULL;
      if (atomic_compare_exchange_strong(&all[i], &none, b)) {
        /* Its thread first: setspecific may allocate, and find it. */
        b->slot = i;
        memtrace_batch_site(b, b->tid);
        atomic_fetch_add(&nbatches, 1);
        mine = b;
        pthread_setspecific(key, b);
        return b;
      }
    }
    lock_spare();
    b->next = spare;
    spare = b;
    atomic_flag_clear_explicit(&spare_lock, memory_order_release);
  }
  unbatched = 1;
  return NULL;
}

static struct batch *batch(void) {
  (void)memtrace_gen(); /* a forked child's batch is set right first */
  struct batch *b = mine;
  if (__builtin_expect(!b, 0) && !unbatched)
    b = get();
  return b;
}

/* The block's allocation still in the batch, if it is (then it leaves its
 * figures there instead of a free). */
static int cancelled(struct batch *b, uint32_t n, uintptr_t p) {
  uint32_t stop = n > LOOK_BACK ? n - LOOK_BACK : 0;
  for (uint32_t i = n; i-- > stop;) {
    struct entry *e = &b->e[i];
    if (e->p != p || !(e->stack & ALLOCATED))
      continue;
    struct entry *before = i > 0 ? &b->e[i - 1] : NULL;
    if (i + 1 == n && before && before->p == 0 && before->stack == e->stack) {
      before->ts++;
      before->size += e->size;
      atomic_store_explicit(&b->n, n - 1, memory_order_release);
    } else {
      e->p = 0;
      e->ts = 1;
    }
    return 1;
  }
  return 0;
}

static void queue(struct batch *b, struct entry e) {
  uint32_t n = atomic_load_explicit(&b->n, memory_order_relaxed);
  if (n == 0)
    b->first = e.ts;
  b->e[n] = e;
  atomic_store_explicit(&b->n, n + 1, memory_order_release);
  if (n + 1 == BATCH || e.ts - b->first > STALE_NS)
    flush(b);
}

int memtrace_batched_free(void *p) {
  struct batch *b = batch();
  if (!b)
    return 0;
  uint32_t n = atomic_load_explicit(&b->n, memory_order_relaxed);
  if (memtrace_memo_on && cancelled(b, n, (uintptr_t)p))
    return 1;
  int shared = atomic_load_explicit(&nbatches, memory_order_relaxed) > 1;
  queue(b, (struct entry){.p = (uintptr_t)p, .ts = now_ns(), .size = (uint64_t)shared});
  return 1;
}

int memtrace_batched_alloc(void *p, size_t size, void *old, unsigned kind, uintptr_t bp) {
  struct batch *b = batch();
  uint64_t stack;
  uintptr_t site = (uintptr_t)memtrace_alloc_sites[memtrace_gen()];
  if (!b || !memtrace_memo_stack(b->tid, b->tgid, bp, site, kind, &stack))
    return 0;
  if (old)
    memtrace_batched_free(old);
  queue(b, (struct entry){.p = (uintptr_t)p, .ts = now_ns(), .size = size,
                          .stack = stack | ALLOCATED});
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
