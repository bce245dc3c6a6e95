/* With WORKLOAD_HANDSHAKE in the environment, a test program says "ready"
 * on stdout once it runs and waits for a line on stdin before its work:
 * the tests' handshake with a tracer attaching by pid (`Paused` in
 * tests/common), in place of a sleep long enough for the tracer. */
#include <stdio.h>
#include <stdlib.h>

static void handshake(void)
{
	char line[16];

	if (!getenv("WORKLOAD_HANDSHAKE"))
		return;
	fputs("ready\n", stdout);
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		exit(3);
}
