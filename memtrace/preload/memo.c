/* The memo (memtrace-common's `shim`): where an exact allocation learns,
 * without trapping, the stack memleak's kernel program would unwind for
 * it. After an allocation traps, the program publishes its unwind in a
 * slot of a memory-mapped BPF array, by thread and frame: the frame
 * pointer at the site, the site (its generation), the shim's function
 * that called it, the unwind tables' generation, and every word of user
 * stack the unwind read with its value. The same function called from the
 * same frame with those words unchanged would unwind the same: the shim
 * queues the allocation in its batch with that stack (frees.c).
 *
 * memtrace hands the slots' map (frozen) and the tables' generation (a
 * sealed memfd page), neither mappable writable,
 * over a Unix socket it names in MEMTRACE_PRELOAD_SAMPLE ("N,memo=NAME",
 * an abstract address), to processes it traces only. Without them (no
 * socket, a process that closed it, `memleak -p`) every allocation traps
 * as before. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "shim.h"

/* memtrace-common's shim::ShimMemo. */
struct memo {
  uint64_t seq, busy, tid /* | tgid << 32 */, bp, site, kind, gen, stack, n;
  uint64_t reads[MEMO_READS][2];
};

static const struct memo *memos;
static const volatile uint32_t *tables_gen;
int memtrace_memo_on;

/* memtrace-common's shim::memo_slot. */
static uint32_t slot_of(uint32_t tid, uint64_t bp) {
  const uint64_t k = 0x9e3779b97f4a7c15ull;
  uint32_t group = (uint32_t)(((uint64_t)tid * k) >> 40) & (MEMO_SLOTS / MEMO_WAYS - 1);
  uint32_t way = (uint32_t)(((bp >> 4) * k) >> 60) & (MEMO_WAYS - 1);
  return group * MEMO_WAYS + way;
}

/* Whether `fd` is a BPF map (the size of whose mapping the kernel checks:
 * a file shorter than the slots would fault where they are read). */
static int bpf_map(int fd) {
  char path[64], link[32];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, link, sizeof link - 1);
  if (n <= 0)
    return 0;
  link[n] = 0;
  return strcmp(link, "anon_inode:bpf-map") == 0;
}

/* Whether `fd` is memtrace's sealed generation page: a memfd no one can
 * write or resize any more. */
static int sealed_page(int fd) {
  int seals = fcntl(fd, F_GET_SEALS);
  int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;
  return seals >= 0 && (seals & want) == want;
}

/* The slots' map and the generation page from memtrace at `name` (after
 * "memo="), mapped read-only. */
void memtrace_memo_init(const char *config) {
  const char *name = config ? strstr(config, ",memo=") : NULL;
  if (!name)
    return;
  name += 6;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  size_t len = strlen(name);
  if (len + 1 >= sizeof a.sun_path)
    return;
  memcpy(a.sun_path + 1, name, len); /* abstract: a leading NUL */
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0)
    return;
  struct timeval t = {.tv_sec = 2};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t);
  int fds[2] = {-1, -1};
  char byte;
  struct iovec io = {.iov_base = &byte, .iov_len = 1};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof fds)];
  } c;
  struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = c.buf,
                     .msg_controllen = sizeof c.buf};
  socklen_t alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
  /* Only root's (memtrace's) maps: another server would hand this process
   * addresses to read. */
  struct ucred cred;
  socklen_t clen = sizeof cred;
  if (connect(s, (struct sockaddr *)&a, alen) == 0 &&
      getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0 && cred.uid == 0 &&
      recvmsg(s, &m, MSG_CMSG_CLOEXEC) == 1) {
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    if (h && h->cmsg_type == SCM_RIGHTS && h->cmsg_len == CMSG_LEN(sizeof fds))
      memcpy(fds, CMSG_DATA(h), sizeof fds);
  }
  close(s);
  if (fds[0] < 0 || fds[1] < 0 || !bpf_map(fds[0]) || !sealed_page(fds[1]))
    goto out;
  /* By system call: the shim's own mmap would report them. */
  void *slots = (void *)syscall(SYS_mmap, NULL, MEMO_SLOTS * sizeof(struct memo), PROT_READ,
                                MAP_SHARED, fds[0], 0);
  void *gen = (void *)syscall(SYS_mmap, NULL, (size_t)sysconf(_SC_PAGESIZE), PROT_READ,
                              MAP_SHARED, fds[1], 0);
  if (slots != MAP_FAILED && gen != MAP_FAILED) {
    tables_gen = gen;
    memos = slots;
    __atomic_store_n(&memtrace_memo_on, 1, __ATOMIC_RELEASE);
  }
out:
  for (int i = 0; i < 2; i++)
    if (fds[i] >= 0)
      close(fds[i]);
}

/* The process is about to change its ids (setuid and the rest): the
 * slots hold words of every traced root process's stack, which an
 * unprivileged process must not read (a daemon forks workers that drop
 * root without an exec). Both mappings are replaced in place by empty
 * ones, so a thread reading them meanwhile reads zeros, which match no
 * slot, and never faults. */
void memtrace_memo_drop(void) {
  if (!__atomic_exchange_n(&memtrace_memo_on, 0, __ATOMIC_ACQ_REL))
    return;
  syscall(SYS_mmap, (void *)memos, MEMO_SLOTS * sizeof(struct memo), PROT_READ,
          MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  syscall(SYS_mmap, (void *)tables_gen, (size_t)sysconf(_SC_PAGESIZE), PROT_READ,
          MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
}

#ifdef MEMTRACE_SHIM_TEST
/* The test's own slots and generation (test/shim_test.c). */
void memtrace_memo_test_set(const void *slots, const volatile uint32_t *gen) {
  tables_gen = gen;
  memos = slots;
  __atomic_store_n(&memtrace_memo_on, 1, __ATOMIC_RELEASE);
}
#endif

/* The stack of an allocation from `kind` (the shim's function) in frame
 * `bp` of thread `tid`, about to call `site`, if its slot holds it. */
int memtrace_memo_stack(uint32_t tid, uint32_t tgid, uintptr_t bp, uintptr_t site, unsigned kind,
                        uint64_t *stack) {
  const struct memo *m = memos + slot_of(tid, bp);
  /* The slot's words, which a writer may be changing: atomic (relaxed)
   * loads, checked by the seqlock; plain ones would be a data race. */
#define SLOT(f) __atomic_load_n(&m->f, __ATOMIC_RELAXED)
  uint64_t seq = __atomic_load_n(&m->seq, __ATOMIC_ACQUIRE);
  if (tid == 0 || seq & 1 || SLOT(tid) != ((uint64_t)tgid << 32 | tid) || SLOT(bp) != bp ||
      SLOT(site) != site || SLOT(kind) != kind)
    return 0;
  uint64_t n = SLOT(n);
  if (SLOT(gen) != *tables_gen || n > MEMO_READS)
    return 0;
  uint64_t s = SLOT(stack);
  for (uint64_t i = 0; i < n; i++) {
    uintptr_t at = SLOT(reads[i][0]);
    uint64_t want = SLOT(reads[i][1]);
    /* Below the frame: the site's return address into the function,
     * which the kind and frame fix. */
    if (at < bp)
      continue;
    /* The slot still this thread's (a writer since could have put
     * another thread's addresses there): only then is `at` in its stack. */
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&m->seq, __ATOMIC_RELAXED) != seq)
      return 0;
    if (*(const uint64_t *)at != want)
      return 0;
  }
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  if (__atomic_load_n(&m->seq, __ATOMIC_RELAXED) != seq)
    return 0;
  *stack = s;
  return 1;
#undef SLOT
}
