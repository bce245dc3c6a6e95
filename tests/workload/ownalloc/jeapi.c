// jemalloc's own API: N blocks of SIZE from mallocx in je_leak_here; of
// each four, one is freed by dallocx, one by sdallocx, one grown to
// 2*SIZE by rallocx and one kept (xallocx asked for the size it has).
// Held: N/4 blocks of 2*SIZE and N/4 of SIZE. An optional third argument
// waits that many ms first (for -p).
#include "../handshake.h"
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

void *mallocx(size_t size, int flags);
void *rallocx(void *ptr, size_t size, int flags);
size_t xallocx(void *ptr, size_t size, size_t extra, int flags);
void dallocx(void *ptr, int flags);
void sdallocx(void *ptr, size_t size, int flags);

static void *kept[1 << 16];

__attribute__((noinline)) void je_leak_here(int n, size_t size)
{
	for (int i = 0; i < n && i < (1 << 16); i++) {
		void *p = mallocx(size, 0);
		switch (i % 4) {
		case 0:
			dallocx(p, 0);
			break;
		case 1:
			sdallocx(p, size, 0);
			break;
		case 2:
			kept[i] = rallocx(p, 2 * size, 0);
			break;
		default:
			if (xallocx(p, size, 0, 0) < size)
				abort();
			kept[i] = p;
		}
	}
	asm volatile("" ::: "memory");
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 400;
	size_t size = argc > 2 ? (size_t)atol(argv[2]) : 1000;
	if (argc > 3)
		usleep(atoi(argv[3]) * 1000);
	handshake();
	je_leak_here(n, size);
	return 0;
}
