/* The allocator shim under ASan and TSan (run.sh), without memtrace: the
 * sites are nops, so the shim forwards and batches. run.sh compiles the
 * shim's sources with its allocator functions renamed (shim_malloc...):
 * they forward to the sanitizer's allocator (through RTLD_NEXT, as
 * preloaded), which then checks the blocks, and it keeps its own malloc.
 *
 * batches: threads allocate and free through the shim; every free must be
 * reported exactly once (frees.c's test hook counts the site's entries),
 * by memtrace_flush_all while the threads are held still (as memtrace
 * calls it) and at each thread's exit, which leaves frees in its batch.
 *
 * memo: a writer thread publishes slots with the kernel's seqlock
 * (memtrace-ebpf/src/memleak/memo.rs) while readers look their stacks up:
 * a reader must only get a stack published for it, in full, with the
 * words on its stack as they are; decoys name other threads (with
 * addresses that fault if followed), another process, or old tables. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../shim.h"

void *shim_malloc(size_t);
void *shim_calloc(size_t, size_t);
void *shim_realloc(void *, size_t);
void shim_free(void *);
int memtrace_injected(unsigned long sample);
void memtrace_memo_test_set(const void *slots, const volatile uint32_t *gen);

static int failures;
#define CHECK(c, fmt, ...)                                                                         \
  ((c) ? (void)0                                                                                   \
       : (fprintf(stderr, "FAIL %s:%d: %s: " fmt "\n", __FILE__, __LINE__, #c, ##__VA_ARGS__),     \
          (void)__atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED)))

static uint32_t gettid_(void) { return (uint32_t)syscall(SYS_gettid); }

/* ---- batches ---- */

#define WORKERS 8
#define ROUNDS 4000
#define LIVE 16
struct entry { uint64_t p, ts, size, stack; }; /* frees.c's */
static uint64_t reported, freed, by_main;
static pthread_t main_thread;
static pthread_barrier_t held, resumed;

/* frees.c's hook: what memtrace_frees_site reports. No memo: frees only. */
void memtrace_test_frees(const struct entry *e, unsigned long n) {
  CHECK(n >= 1 && n <= 64, "n %lu", n);
  for (unsigned long i = 0; i < n; i++) {
    CHECK(e[i].p && !e[i].stack && e[i].size <= 1, "entry %lu: p %#lx stack %#lx size %lu", i,
          (unsigned long)e[i].p, (unsigned long)e[i].stack, (unsigned long)e[i].size);
    CHECK(i == 0 || e[i].ts >= e[i - 1].ts, "entry %lu out of order", i);
  }
  __atomic_fetch_add(&reported, n, __ATOMIC_RELAXED);
  if (pthread_equal(pthread_self(), main_thread))
    by_main += n;
}

static void churn(unsigned *seed, void **live, uint64_t *frees) {
  for (int r = 0; r < ROUNDS; r++) {
    unsigned k = (unsigned)rand_r(seed) % LIVE, size = 1 + (unsigned)rand_r(seed) % 300;
    void *p = live[k];
    switch (rand_r(seed) % 4) {
    case 0:
    case 1:
      shim_free(p);
      *frees += p != NULL;
      live[k] = r & 1 ? shim_malloc(size) : shim_calloc(1 + size % 7, 8);
      break;
    case 2: /* the old block is reported with the new one, not batched */
      live[k] = shim_realloc(p, size);
      break;
    default:
      shim_free(p);
      *frees += p != NULL;
      live[k] = NULL;
    }
    if (live[k])
      memset(live[k], r, 1); /* the sanitizer checks the block is one */
  }
  shim_free(shim_malloc(8)); /* at least one free left in the batch */
  *frees += 1;
}

static void *worker(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  void *live[LIVE] = {0};
  uint64_t frees = 0;
  churn(&seed, live, &frees);
  pthread_barrier_wait(&held); /* main flushes every batch meanwhile */
  pthread_barrier_wait(&resumed);
  churn(&seed, live, &frees);
  for (int k = 0; k < LIVE; k++) {
    frees += live[k] != NULL;
    shim_free(live[k]);
  }
  shim_free(shim_malloc(8)); /* exits with frees batched */
  __atomic_fetch_add(&freed, frees + 1, __ATOMIC_RELAXED);
  return NULL;
}

static void test_batches(void) {
  main_thread = pthread_self();
  /* The first call finds the allocator past the shim: one thread's. */
  free(shim_malloc(1));
  pthread_t t[WORKERS];
  pthread_barrier_init(&held, NULL, WORKERS + 1);
  pthread_barrier_init(&resumed, NULL, WORKERS + 1);
  for (uintptr_t i = 0; i < WORKERS; i++)
    CHECK(pthread_create(&t[i], NULL, worker, (void *)(i + 1)) == 0, "create");
  pthread_barrier_wait(&held);
  memtrace_flush_all();
  uint64_t first = by_main;
  CHECK(first > 0, "flush_all reported no held frees");
  memtrace_flush_all();
  CHECK(by_main == first, "a second flush_all reported %lu more", (unsigned long)(by_main - first));
  pthread_barrier_wait(&resumed);
  for (int i = 0; i < WORKERS; i++)
    pthread_join(t[i], NULL);
  CHECK(reported == freed, "%lu frees reported of %lu", (unsigned long)reported,
        (unsigned long)freed);
  printf("batches: %lu frees reported, %lu by flush_all\n", (unsigned long)reported,
         (unsigned long)by_main);
}

/* ---- memo ---- */

/* memo.c's: the thread's tid, and its process's tgid in the high half. */
struct memo {
  uint64_t seq, busy, tid, bp, site, kind, gen, stack, n;
  uint64_t reads[MEMO_READS][2];
};
#define READERS 3
/* Long frames: a rewrite lands inside the reader's loop over them. */
#define WORDS (MEMO_READS - 1)
#define MEMO_NS 600000000ull
#define KIND 1
#define GEN 7
/* A stack id: publish's kind (0: the reader's own), iteration, phase (ANY:
 * no word above the frame, the case only the last check of seq guards), reader. */
#define ANY 0xf
#define TAG(kind, iter, phase, r) ((uint64_t)(iter) << 16 | (kind) << 12 | (phase) << 8 | (r))
enum { OWN, OTHER_THREAD, OTHER_PROCESS, OLD_TABLES, DECOYS };
/* Never followed: an address that faults; and a thread no process has. */
#define FAULTS ((uint64_t)-4096)
#define NO_THREAD (1u << 30)

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static struct memo *slots;
static uint32_t *tables_gen;
static uintptr_t site;
static struct reader {
  uint32_t tid;
  uintptr_t bp;
  uint64_t hits, calls;
} rd[READERS];
static int started, stop;

/* memtrace-common's shim::memo_slot. */
static uint32_t slot_of(uint32_t tid, uint64_t bp) {
  const uint64_t k = 0x9e3779b97f4a7c15ull;
  uint32_t group = (uint32_t)(((uint64_t)tid * k) >> 40) & (MEMO_SLOTS / MEMO_WAYS - 1);
  uint32_t way = (uint32_t)(((bp >> 4) * k) >> 60) & (MEMO_WAYS - 1);
  return group * MEMO_WAYS + way;
}

/* The value a reader's stack word `j` holds in `phase`. */
static uint64_t word(unsigned phase, int j) { return 0x5e90000000000000ull | phase << 8 | j; }

static void put(uint64_t *at, uint64_t v) { __atomic_store_n(at, v, __ATOMIC_RELAXED); }

/* memo.rs's publish: seq odd, the fields, seq even (release). The words
 * are the `n` from `bp` up (and one below it, which the reader skips). */
static void publish(struct memo *m, uint64_t tid, uint64_t tgid, uintptr_t bp, uint64_t gen,
                    uint64_t stack, unsigned phase, int n, uint64_t at_or_faults) {
  uint64_t seq = __atomic_load_n(&m->seq, __ATOMIC_RELAXED) | 1;
  put(&m->seq, seq);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  put(&m->tid, tgid << 32 | tid), put(&m->bp, bp), put(&m->site, site);
  put(&m->kind, KIND), put(&m->gen, gen), put(&m->stack, stack);
  put(&m->reads[0][0], bp - 8), put(&m->reads[0][1], 0);
  for (int j = 0; j < n; j++) {
    put(&m->reads[j + 1][0], at_or_faults == FAULTS ? FAULTS : bp + 8 * (uint64_t)j);
    put(&m->reads[j + 1][1], word(phase, j));
  }
  put(&m->n, (uint64_t)n + 1);
  __atomic_store_n(&m->seq, seq + 1, __ATOMIC_RELEASE);
}

static void *reader(void *arg) {
  struct reader *r = arg;
  unsigned me = (unsigned)(r - rd), phase = 0;
  volatile uint64_t words[WORDS]; /* the frame the slots describe */
  for (int j = 0; j < WORDS; j++)
    words[j] = word(phase, j);
  r->tid = gettid_();
  r->bp = (uintptr_t)words;
  __atomic_fetch_add(&started, 1, __ATOMIC_RELEASE);
  uint32_t tgid = (uint32_t)getpid();
  for (uint64_t c = 0; !__atomic_load_n(&stop, __ATOMIC_ACQUIRE); c++) {
    if (c % 64 == 63) { /* the frame's words change: older slots no longer hold */
      phase ^= 1;
      for (int j = 0; j < WORDS; j++)
        words[j] = word(phase, j);
    }
    uint64_t s = 0;
    if (memtrace_memo_stack(r->tid, tgid, r->bp, site, KIND, &s)) {
      r->hits++;
      unsigned p = s >> 8 & 0xf;
      CHECK((s & 0xff) == me && (p == phase || p == ANY) && (s >> 12 & 0xf) == OWN,
            "reader %u phase %u got stack %#lx", me, phase, (unsigned long)s);
    }
    r->calls++;
  }
  return NULL;
}

static void *writer(void *arg) {
  (void)arg;
  unsigned seed = 1;
  uint64_t tgid = (uint64_t)getpid();
  uint64_t end = now_ns() + MEMO_NS;
  for (uint32_t i = 0; (i & 255) || now_ns() < end; i++) {
    unsigned r = i % READERS, kind = (unsigned)rand_r(&seed) % (2 * DECOYS);
    unsigned phase = (unsigned)rand_r(&seed) & 1, n = (unsigned)rand_r(&seed) % (WORDS + 1);
    struct reader *x = &rd[r];
    struct memo *m = &slots[slot_of(x->tid, x->bp)];
    kind = kind >= DECOYS ? OWN : kind; /* half the writes are the reader's own */
    uint64_t tag = TAG(kind, i, n ? phase : ANY, r);
    publish(m, kind == OTHER_THREAD ? x->tid ^ NO_THREAD : x->tid,
            kind == OTHER_PROCESS ? tgid + 1 : tgid, x->bp, kind == OLD_TABLES ? GEN - 1 : GEN, tag,
            phase, (int)n, kind == OTHER_THREAD ? FAULTS : 0);
    for (int spin = rand_r(&seed) % 200; spin > 0; spin--) /* slots stay a while */
      __asm__ volatile("" ::: "memory");
  }
  return NULL;
}

/* One thread's checks: what memo.c refuses, one field at a time. */
static void test_memo_fields(void) {
  volatile uint64_t words[WORDS];
  for (int j = 0; j < WORDS; j++)
    words[j] = word(0, j);
  uint32_t tid = gettid_(), tgid = (uint32_t)getpid();
  uintptr_t bp = (uintptr_t)words;
  struct memo *m = &slots[slot_of(tid, bp)];
  uint64_t s = 0;
  publish(m, tid, tgid, bp, GEN, 42, 0, WORDS, 0);
  CHECK(memtrace_memo_stack(tid, tgid, bp, site, KIND, &s) && s == 42, "%#lx", (unsigned long)s);
  CHECK(!memtrace_memo_stack(tid, tgid + 1, bp, site, KIND, &s), "another process's tgid");
  CHECK(!memtrace_memo_stack(tid, tgid, bp, site, KIND + 1, &s), "another kind");
  CHECK(!memtrace_memo_stack(0, tgid, bp, site, KIND, &s), "thread 0");
  words[WORDS - 1] ^= 1;
  CHECK(!memtrace_memo_stack(tid, tgid, bp, site, KIND, &s), "a word changed");
  words[WORDS - 1] ^= 1;
  publish(m, tid, tgid + 1, bp, GEN, 43, 0, WORDS, 0);
  CHECK(!memtrace_memo_stack(tid, tgid, bp, site, KIND, &s), "slot of another process");
  publish(m, tid, tgid, bp, GEN - 1, 44, 0, WORDS, 0);
  CHECK(!memtrace_memo_stack(tid, tgid, bp, site, KIND, &s), "slot of older tables");
  publish(m, tid, tgid, bp, GEN, 45, 0, WORDS, 0);
  put(&m->seq, m->seq | 1);
  CHECK(!memtrace_memo_stack(tid, tgid, bp, site, KIND, &s), "slot being written");
  memset(m, 0, sizeof *m);
}

static void test_memo(void) {
  size_t size = MEMO_SLOTS * sizeof(struct memo);
  slots = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  tables_gen = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK(slots != MAP_FAILED && tables_gen != MAP_FAILED, "mmap");
  *tables_gen = GEN;
  site = (uintptr_t)memtrace_alloc_sites[SITE_GENS];
  memtrace_memo_test_set(slots, tables_gen);
  test_memo_fields();
  pthread_t r[READERS], w;
  for (int i = 0; i < READERS; i++)
    CHECK(pthread_create(&r[i], NULL, reader, &rd[i]) == 0, "create");
  while (__atomic_load_n(&started, __ATOMIC_ACQUIRE) < READERS)
    sched_yield();
  CHECK(pthread_create(&w, NULL, writer, NULL) == 0, "create");
  pthread_join(w, NULL);
  __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
  uint64_t hits = 0;
  for (int i = 0; i < READERS; i++) {
    pthread_join(r[i], NULL);
    hits += rd[i].hits;
  }
  /* Else the test proved nothing (a layout or slot not memo.c's). */
  CHECK(hits > 0, "no reader found its stack in %lu calls", (unsigned long)rd[0].calls);
  printf("memo: %lu hits in %lu calls\n", (unsigned long)hits,
         (unsigned long)(rd[0].calls + rd[1].calls + rd[2].calls));
}

int main(void) {
  /* A runtime linked into the executable (clang's) is not past it, where
   * the shim looks: forward to the program's own, as `memleak -p` does. */
  if (dlsym(RTLD_NEXT, "malloc") != dlsym(RTLD_DEFAULT, "malloc"))
    CHECK(memtrace_injected(0) == 0, "no malloc");
  test_batches();
  test_memo();
  return failures ? 1 : 0;
}
