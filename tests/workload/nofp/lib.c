/* A library without frame pointers, dlopen'd by nofp.c after tracing starts. */
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define KEEP() __asm__ volatile("" ::: "memory")

__attribute__((noinline)) static void lib_touch_inner(int n)
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

__attribute__((noinline)) void lib_touch_pages(int n)
{
	lib_touch_inner(n);
	KEEP();
}
