// Leaks N objects through two named functions, built without frame
// pointers: memleak's stacks must pass operator new (libstdc++, no frame
// pointers either) to reach them. Held until the tracer reports. An
// optional second argument waits that many ms first; WORKLOAD_HANDSHAKE
// waits for the tracer's go (for -p).
#include "../handshake.h"
#include <cstdlib>
#include <unistd.h>
#include <vector>

struct Blob {
	char bytes[200];
};

static std::vector<Blob *> *kept;

__attribute__((noinline)) void cpp_leak_inner(int n)
{
	for (int i = 0; i < n; i++)
		kept->push_back(new Blob());
	asm volatile("" ::: "memory");
}

__attribute__((noinline)) void cpp_leak_outer(int n)
{
	cpp_leak_inner(n);
	asm volatile("" ::: "memory");
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 100;
	if (argc > 2)
		usleep(atoi(argv[2]) * 1000);
	handshake();
	kept = new std::vector<Blob *>();
	kept->reserve(n);
	cpp_leak_outer(n);
	return 0;
}
