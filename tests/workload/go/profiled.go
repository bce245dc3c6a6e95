//go:build profiled

// Built with -tags profiled: the program uses runtime.MemProfile (through
// runtime/pprof), so the Go linker leaves the runtime's heap profiling on,
// as it is in a service that serves net/http/pprof.
package main

import (
	"os"
	"runtime/pprof"
)

func init() {
	if os.Getenv("HOARD_HEAP_PROFILE") != "" {
		pprof.WriteHeapProfile(os.Stderr)
	}
}
