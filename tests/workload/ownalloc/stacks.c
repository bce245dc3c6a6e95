/* 20,000 blocks held, each malloc'd from its own call path: 15 levels of
 * recursion through one of two functions each, chosen by the bits of the
 * block's number (memleak's table of stacks, tests/allocators.rs). */
#include <stdlib.h>

#define BLOCKS 20000
static void *keep[BLOCKS];
static int n;

__attribute__((noinline)) static void walk(int depth, unsigned bits);

/* The empty asm after each call keeps it from being a tail call. */
__attribute__((noinline)) static void left(int d, unsigned b) {
  walk(d, b);
  __asm__ volatile("");
}

__attribute__((noinline)) static void right(int d, unsigned b) {
  walk(d, b);
  __asm__ volatile("");
}

__attribute__((noinline)) static void walk(int d, unsigned b) {
  if (d == 0) {
    keep[n++] = malloc(16);
    return;
  }
  if (b & 1)
    left(d - 1, b >> 1);
  else
    right(d - 1, b >> 1);
  __asm__ volatile("");
}

int main(void) {
  for (unsigned b = 0; b < BLOCKS; b++)
    walk(15, b);
  return keep[BLOCKS - 1] == NULL;
}
