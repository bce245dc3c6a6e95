/* A library the workload dlopens after memleak -p pointed its allocator
 * calls at the shim (late-lib): its own calls of malloc must be seen too. */
#include <stddef.h>
#include <stdlib.h>

__attribute__((noinline)) void late_leak(size_t k, size_t size) {
  for (size_t i = 0; i < k; i++) {
    volatile char *p = malloc(size);
    if (p)
      p[0] = 1;
  }
}
