/* A workload built without frame pointers (-fomit-frame-pointer), as most
 * distribution code is: its stacks are complete only when unwound with
 * .eh_frame. Each call chain is three named functions deep. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

/* KEEP() and TOUCH_PAGES(), shared with lib.c. */
#include "nofp.h"
#include "../handshake.h"

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
	TOUCH_PAGES(n);
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

/* Blocks malloc'd and never freed (memleak), kept reachable (global, so
 * the compiler cannot drop the malloc calls). */
void *kept[4096];

__attribute__((noinline)) void leak_inner(int n)
{
	for (int i = 0; i < n && i < 4096; i++)
		kept[i] = malloc(100);
	KEEP();
}

__attribute__((noinline)) void leak_middle(int n)
{
	leak_inner(n);
	KEEP();
}

__attribute__((noinline)) void leak_outer(int n)
{
	leak_middle(n);
	KEEP();
}

/* Blocks from two paths in turn, then `n` more from the first: the same
 * registers at the allocator each time, the stacks apart only by the
 * return address into alt_a or alt_b (the unwinder's memo of the last
 * stack must see it). Kept in kept2. */
void *kept2[8192];

__attribute__((noinline)) void alt_leaf(int i)
{
	kept2[i & 8191] = malloc(100);
	KEEP();
}

__attribute__((noinline)) void alt_a(int i)
{
	alt_leaf(i);
	KEEP();
}

__attribute__((noinline)) void alt_b(int i)
{
	alt_leaf(i);
	KEEP();
}

__attribute__((noinline)) void alternate(int n)
{
	for (int i = 0; i < n; i++)
		(i & 1 ? alt_b : alt_a)(i);
	for (int i = n; i < 2 * n; i++)
		alt_a(i);
}

/* Blocks from a caller that keeps a new value in rbp each call, saved
 * where its unwind information says (code without frame pointers keeps any
 * data there: a server's request): the unwind never uses it, so memleak's
 * memo of the stack must not depend on it. Kept in kept3. */
void *kept3[8192];

__attribute__((noinline)) void churn_leaf(int i)
{
	kept3[i & 8191] = malloc(64);
	KEEP();
}

#if defined(__x86_64__)
/* keep_in_rbp(i): rbp saved (CFI says where), i in it, churn_leaf called. */
void keep_in_rbp(int i);
__asm__(".text\n"
	".globl keep_in_rbp\n"
	".type keep_in_rbp, @function\n"
	"keep_in_rbp:\n"
	".cfi_startproc\n"
	"push %rbp\n"
	".cfi_def_cfa_offset 16\n"
	".cfi_offset %rbp, -16\n"
	"movslq %edi, %rbp\n"
	"call churn_leaf\n"
	"pop %rbp\n"
	".cfi_def_cfa_offset 8\n"
	"ret\n"
	".cfi_endproc\n"
	".size keep_in_rbp, .-keep_in_rbp\n");

__attribute__((noinline)) int churn_loop(int n)
{
	for (int i = 0; i < n; i++)
		keep_in_rbp(i);
	return 0;
}
#else
__attribute__((noinline)) int churn_loop(int n)
{
	(void)n;
	return 2;
}
#endif

/* Recurses `depth` frames, then touches `n` pages: a stack deeper than an
 * unwinder keeps. */
__attribute__((noinline)) void deep_recurse(int depth, int n)
{
	if (depth > 1)
		deep_recurse(depth - 1, n);
	else
		pages_touch_inner(n);
	KEEP();
}

/* dlopen's `lib` once tracing runs, calls its lib_touch_pages(1), waits,
 * then lib_touch_pages(n): code mapped after its process's maps were read. */
static int touch_in_library(const char *lib, int n)
{
	usleep(300 * 1000);
	void *h = dlopen(lib, RTLD_NOW);
	if (!h) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	void (*touch)(int) = (void (*)(int))dlsym(h, "lib_touch_pages");
	if (!touch)
		return 1;
	touch(1);
	usleep(300 * 1000);
	touch(n);
	return 0;
}

/* Pages touched inside a signal handler: the stack goes through the
 * kernel's signal frame (glibc's __restore_rt) back to signal_raise. */
static int signal_pages;

__attribute__((noinline)) void signal_touch(int n)
{
	TOUCH_PAGES(n);
	KEEP();
}

__attribute__((noinline)) void signal_handler(int sig)
{
	(void)sig;
	signal_touch(signal_pages);
	KEEP();
}

__attribute__((noinline)) void signal_raise(int n)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = signal_handler;
	if (sigaction(SIGUSR1, &sa, NULL))
		exit(1);
	signal_pages = n;
	raise(SIGUSR1);
	KEEP();
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: nofp sbrk|touch|leak|alternate|churn|signal N | deep D N | dlopen N LIB\n");
		return 2;
	}
	int n = atoi(argv[2]);
	/* For tracers that attach after it started: its work comes later. */
	const char *delay = getenv("NOFP_DELAY_MS");
	if (delay)
		usleep(atoi(delay) * 1000);
	handshake();
	if (!strcmp(argv[1], "sbrk"))
		heap_grow_outer(n);
	else if (!strcmp(argv[1], "touch"))
		pages_touch_outer(n);
	else if (!strcmp(argv[1], "signal"))
		signal_raise(n);
	else if (!strcmp(argv[1], "leak"))
		leak_outer(n);
	else if (!strcmp(argv[1], "alternate") && n <= 4096)
		alternate(n);
	else if (!strcmp(argv[1], "churn") && n <= 8192)
		return churn_loop(n);
	else if (!strcmp(argv[1], "deep") && argc > 3)
		deep_recurse(n, atoi(argv[3]));
	else if (!strcmp(argv[1], "dlopen") && argc > 3)
		return touch_in_library(argv[3], n);
	else
		return 2;
	return 0;
}
