/* The ways a program reaches past a preloaded shim, closed:
 *
 * - dlsym: ctypes' CDLL("libc.so.6").malloc, JNA, LuaJIT's FFI and any
 *   dlsym(handle, "malloc") look the allocator up in its own library's
 *   handle, which finds glibc's and not the shim's: those calls were never
 *   seen. The shim's dlsym gives its own function wherever the lookup
 *   finds the one the shim forwards to.
 * - exec with a preload of its own: `LD_PRELOAD=lib prog` in a shell
 *   replaces the shim's entry. The shim's execve, execvpe, fexecve and
 *   posix_spawn(p) put it back first in LD_PRELOAD (before the command's
 *   own preloads, whose allocator it then forwards to), with its sampling
 *   rate.
 * - exec with LD_PRELOAD removed (`env -i`, an environment built without
 *   it): the program asked its children not to preload anything, and is
 *   obeyed. The exec is counted (the hello site's `lost`), and memtrace
 *   says how many children were lost that way.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

#define EXPORT __attribute__((visibility("default")))

/* Weak, and glibc's oldest version on each architecture: before 2.34
 * dlvsym is libdl's, which the program may not load. */
#pragma weak dlvsym
#if defined(__x86_64__)
__asm__(".symver dlvsym,dlvsym@GLIBC_2.2.5");
#elif defined(__aarch64__)
__asm__(".symver dlvsym,dlvsym@GLIBC_2.17");
#else
#error "the shim knows glibc's first symbol version on x86_64 and aarch64 only"
#endif

dlsym_fn memtrace_real_dlsym(void) {
  static _Atomic(dlsym_fn) real;
  dlsym_fn f = atomic_load_explicit(&real, memory_order_acquire);
  if (!f && dlvsym) {
    void *s = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!s)
      s = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    __builtin_memcpy(&f, &s, sizeof s);
    atomic_store_explicit(&real, f, memory_order_release);
  }
  return f;
}

/* The allocator functions the shim defines, by name. */
#define N_FNS 10
static const char *const NAMES[N_FNS] = {
    "malloc",  "free",          "calloc",         "realloc", "reallocarray",
    "memalign", "aligned_alloc", "posix_memalign", "valloc",  "pvalloc",
};
static void *const OURS[N_FNS] = {
    (void *)malloc,  (void *)free,          (void *)calloc,         (void *)realloc,
    (void *)reallocarray, (void *)memalign, (void *)aligned_alloc, (void *)posix_memalign,
    (void *)valloc,  (void *)pvalloc,
};
/* What each resolves to past the shim (looked up once): what the program
 * would call without it. */
static _Atomic(void *) theirs[N_FNS];

static int interposed(const char *name) {
  if (!name)
    return -1;
  for (int i = 0; i < N_FNS; i++)
    if (strcmp(name, NAMES[i]) == 0)
      return i;
  return -1;
}

EXPORT void *dlsym(void *handle, const char *name) {
  dlsym_fn real = memtrace_real_dlsym();
  if (!real)
    return NULL;
  int i = handle == RTLD_NEXT ? -1 : interposed(name);
  /* A tail call (checked by a test): glibc finds whose "next" RTLD_NEXT
   * means from the return address. */
  if (i < 0)
    return real(handle, name);
  void *s = real(handle, name);
  void *t = atomic_load_explicit(&theirs[i], memory_order_relaxed);
  if (!t) {
    t = real(RTLD_NEXT, NAMES[i]);
    atomic_store_explicit(&theirs[i], t, memory_order_relaxed);
  }
  return s && s == t ? OURS[i] : s;
}

/* The shim's own LD_PRELOAD entry and sampling variable, read at start. */
static char self[4096];
static char sample_var[64];

__attribute__((constructor)) static void find_self(void) {
  const char *p = getenv("LD_PRELOAD");
  while (p && *p) {
    size_t n = strcspn(p, ": ");
    if (n < sizeof self && memmem(p, n, "memtrace-preload-", 17)) {
      memcpy(self, p, n);
      self[n] = 0;
      break;
    }
    p += n + (p[n] != 0);
  }
  const char *s = getenv("MEMTRACE_PRELOAD_SAMPLE");
  if (s && strlen(s) + 25 < sizeof sample_var) {
    strcpy(sample_var, "MEMTRACE_PRELOAD_SAMPLE=");
    strcat(sample_var, s);
  }
}

static int starts(const char *s, const char *prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* Whether the list `v` (':' or ' ' separated) has `self` in it. */
static int listed(const char *v) {
  size_t len = strlen(self);
  while (*v) {
    size_t n = strcspn(v, ": ");
    if (n == len && memcmp(v, self, n) == 0)
      return 1;
    v += n + (v[n] != 0);
  }
  return 0;
}

/* `envp` with the shim first in LD_PRELOAD and the sampling rate, in memory
 * mapped here (no allocator: this may run in a vfork child), or NULL when
 * it has both. `*len`: bytes mapped. */
static char **with_shim(char *const envp[], size_t *len) {
  if (!self[0] || !envp)
    return NULL;
  const char *pre = NULL;
  int has_sample = !sample_var[0];
  size_t n = 0;
  for (; envp[n]; n++) {
    if (starts(envp[n], "LD_PRELOAD="))
      pre = envp[n] + 11;
    else if (starts(envp[n], "MEMTRACE_PRELOAD_SAMPLE="))
      has_sample = 1;
  }
  /* Removed on purpose: obeyed, and said (if the exec then fails, a
   * child is counted lost that never was). */
  if (!pre) {
    memtrace_exec_unpreloaded();
    return NULL;
  }
  int has_self = listed(pre);
  if (has_self && has_sample)
    return NULL;
  *len = (n + 3) * sizeof(char *) + 11 + strlen(self) + 1 + (pre ? strlen(pre) : 0) + 1;
  void *m = (void *)syscall(SYS_mmap, NULL, *len, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    return NULL;
  char **e = m;
  char *s = (char *)(e + n + 3);
  size_t j = 0;
  for (size_t i = 0; i < n; i++)
    if (has_self || !starts(envp[i], "LD_PRELOAD="))
      e[j++] = envp[i];
  if (!has_self) {
    e[j++] = s;
    s = stpcpy(stpcpy(s, "LD_PRELOAD="), self);
    if (pre && *pre)
      s = stpcpy(stpcpy(s, ":"), pre);
  }
  if (!has_sample)
    e[j++] = sample_var;
  e[j] = NULL;
  return e;
}

static void *past_shim(const char *name) {
  dlsym_fn real = memtrace_real_dlsym();
  return real ? real(RTLD_NEXT, name) : NULL;
}

/* Calls `call` with the environment `envp` given the shim. */
#define WITH_SHIM(envp, call)                                                                      \
  ({                                                                                               \
    size_t len_ = 0;                                                                               \
    char **e_ = with_shim(envp, &len_);                                                            \
    char *const *env = e_ ? e_ : (envp);                                                           \
    __typeof__(call) r_ = call;                                                                    \
    if (e_)                                                                                        \
      syscall(SYS_munmap, e_, len_);                                                               \
    r_;                                                                                            \
  })

EXPORT int execve(const char *path, char *const argv[], char *const envp[]) {
  return WITH_SHIM(envp, (int)syscall(SYS_execve, path, argv, env));
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[]) {
  int (*f)(int, char *const[], char *const[]) = past_shim("fexecve");
  return WITH_SHIM(envp, f ? f(fd, argv, env) : -1);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[]) {
  int (*f)(const char *, char *const[], char *const[]) = past_shim("execvpe");
  return WITH_SHIM(envp, f ? f(file, argv, env) : -1);
}

/* exec by the process's own environment (execvp, execv: what `env`
 * calls once it has set or cleared LD_PRELOAD) goes through the wrappers
 * above with it, so that it is treated as an environment passed. */
EXPORT int execvp(const char *file, char *const argv[]) {
  extern char **environ;
  return execvpe(file, argv, environ);
}

EXPORT int execv(const char *path, char *const argv[]) {
  extern char **environ;
  return execve(path, argv, environ);
}

typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                        const posix_spawnattr_t *, char *const[], char *const[]);

EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                       const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
  spawn_fn f = past_shim("posix_spawn");
  return WITH_SHIM(envp, f ? f(pid, path, fa, attr, argv, env) : ENOSYS);
}

EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                        const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
  spawn_fn f = past_shim("posix_spawnp");
  return WITH_SHIM(envp, f ? f(pid, file, fa, attr, argv, env) : ENOSYS);
}

/* A change of ids first lets go of the memo (memo.c): what root's
 * processes' stacks held is not for the user the process becomes. */
#define DROPS_MEMO(name, params, args)                                                            \
  EXPORT int name params {                                                                         \
    int(*f) params = past_shim(#name);                                                             \
    memtrace_memo_drop();                                                                          \
    if (!f) {                                                                                      \
      errno = ENOSYS;                                                                              \
      return -1;                                                                                   \
    }                                                                                              \
    return f args;                                                                                 \
  }
DROPS_MEMO(setuid, (uid_t u), (u))
DROPS_MEMO(seteuid, (uid_t u), (u))
DROPS_MEMO(setreuid, (uid_t r, uid_t e), (r, e))
DROPS_MEMO(setresuid, (uid_t r, uid_t e, uid_t s), (r, e, s))
DROPS_MEMO(setgid, (gid_t g), (g))
DROPS_MEMO(setegid, (gid_t g), (g))
DROPS_MEMO(setregid, (gid_t r, gid_t e), (r, e))
DROPS_MEMO(setresgid, (gid_t r, gid_t e, gid_t s), (r, e, s))
DROPS_MEMO(setgroups, (size_t n, const gid_t *l), (n, l))
