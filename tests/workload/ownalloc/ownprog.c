/* A program linked with its own allocator (libownalloc.so): leaks K blocks
 * of SIZE bytes from leak_here, allocates and frees N more in churn, asks
 * the allocator for each leaked block's size, and says how many blocks the
 * allocator served. Usage: ownprog [--wait] K SIZE N; with --wait, as the
 * main workload: its pid on a line, then it waits for a line on stdin. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

unsigned long ownalloc_served(void);
size_t malloc_usable_size(void *);

static void *kept[4096];

__attribute__((noinline)) void leak_here(int k, size_t size) {
  for (int i = 0; i < k; i++)
    kept[i] = malloc(size);
}

__attribute__((noinline)) void churn(int n) {
  for (int i = 0; i < n; i++) {
    void *p = malloc(64 + i % 100);
    p = realloc(p, 300);
    free(p);
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--wait") == 0) {
    char line[16];
    printf("%d\n", (int)getpid());
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
      return 1;
    argv++;
  }
  int k = atoi(argv[1]), n = atoi(argv[3]);
  size_t size = strtoul(argv[2], NULL, 10);
  leak_here(k, size);
  churn(n);
  size_t usable = 0;
  for (int i = 0; i < k; i++)
    usable += malloc_usable_size(kept[i]);
  printf("ownalloc_served %lu usable %zu\n", ownalloc_served(), usable);
  return 0;
}
