/* Looks malloc up twice: RTLD_DEFAULT (the first definition in the global
 * scope) and RTLD_NEXT from the program (the first after it). With a
 * preload before every library both are the preload's: a dlsym that
 * stands in between must keep RTLD_NEXT relative to its caller. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

int main(void) {
  void *d = dlsym(RTLD_DEFAULT, "malloc"), *n = dlsym(RTLD_NEXT, "malloc");
  printf("rtld-next %s\n", d && d == n ? "same" : "differs");
  return 0;
}
