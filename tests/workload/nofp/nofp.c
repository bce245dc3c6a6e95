/* A workload built without frame pointers (-fomit-frame-pointer), as most
 * distribution code is: its stacks are complete only when unwound with
 * .eh_frame. Each call chain is three named functions deep. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Keeps each call out of tail position, so every frame stays on the stack. */
#define KEEP() __asm__ volatile("" ::: "memory")

__attribute__((noinline)) void heap_grow_inner(int n)
{
	for (int i = 0; i < n; i++)
		if (sbrk(4096) == (void *)-1)
			exit(1);
	KEEP();
}

__attribute__((noinline)) void heap_grow_middle(int n)
{
	heap_grow_inner(n);
	KEEP();
}

__attribute__((noinline)) void heap_grow_outer(int n)
{
	heap_grow_middle(n);
	KEEP();
}

__attribute__((noinline)) void pages_touch_inner(int n)
{
	long page = sysconf(_SC_PAGESIZE);
	char *p = mmap(NULL, n * page, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		exit(1);
	madvise(p, n * page, MADV_NOHUGEPAGE);
	for (int i = 0; i < n; i++)
		p[i * page] = 1;
	KEEP();
}

__attribute__((noinline)) void pages_touch_middle(int n)
{
	pages_touch_inner(n);
	KEEP();
}

__attribute__((noinline)) void pages_touch_outer(int n)
{
	pages_touch_middle(n);
	KEEP();
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: nofp sbrk|touch N\n");
		return 2;
	}
	int n = atoi(argv[2]);
	if (!strcmp(argv[1], "sbrk"))
		heap_grow_outer(n);
	else if (!strcmp(argv[1], "touch"))
		pages_touch_outer(n);
	else
		return 2;
	return 0;
}
