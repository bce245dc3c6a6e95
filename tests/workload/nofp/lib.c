/* A library without frame pointers, dlopen'd by nofp.c after tracing starts. */
#include "nofp.h"

__attribute__((noinline)) static void lib_touch_inner(int n)
{
	TOUCH_PAGES(n);
	KEEP();
}

__attribute__((noinline)) void lib_touch_pages(int n)
{
	lib_touch_inner(n);
	KEEP();
}
