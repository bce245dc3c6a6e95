/* Shared by nofp.c and lib.c. */
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Keeps each call out of tail position, so every frame stays on the stack. */
#define KEEP() __asm__ volatile("" ::: "memory")

/* Maps N fresh pages and writes a byte to each: one fault a page. A macro,
 * not a function: the faults stay in the function that uses it, with no
 * frame (not even an inlined one) of their own. */
#define TOUCH_PAGES(N)                                                     \
	do {                                                               \
		long page_ = sysconf(_SC_PAGESIZE);                        \
		char *p_ = mmap(NULL, (N) * page_, PROT_READ | PROT_WRITE, \
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);       \
		if (p_ == MAP_FAILED)                                      \
			exit(1);                                           \
		madvise(p_, (N) * page_, MADV_NOHUGEPAGE);                 \
		for (int i_ = 0; i_ < (N); i_++)                           \
			p_[i_ * page_] = 1;                                \
	} while (0)
