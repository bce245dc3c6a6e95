// The Go workload: hoard() keeps N blocks of 64 KiB (1,000 by default),
// touching each page, from one function. With --wait first (the tests'
// Workload protocol): prints its pid, waits for a line on stdin, hoards,
// says "held N" and holds the blocks until stdin closes, then says its
// heap profile's rate ("rate N": 0 where the Go linker left profiling off). With --grow: 2 MiB
// more every 100 ms, for ever (until a memory cgroup's OOM kill).
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"time"
)

var kept [][]byte

//go:noinline
func hoard(n int) {
	for i := 0; i < n; i++ {
		b := make([]byte, 65536)
		for j := 0; j < len(b); j += 4096 {
			b[j] = 1
		}
		kept = append(kept, b)
	}
}

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--grow" {
		for {
			hoard(32)
			time.Sleep(100 * time.Millisecond)
		}
	}
	wait := len(args) > 0 && args[0] == "--wait"
	in := bufio.NewReader(os.Stdin)
	if wait {
		args = args[1:]
		fmt.Println(os.Getpid())
		in.ReadString('\n')
	}
	n := 1000
	if len(args) > 0 {
		n, _ = strconv.Atoi(args[0])
	}
	hoard(n)
	fmt.Println("held", len(kept))
	if wait {
		io.Copy(io.Discard, in)
		fmt.Println("rate", runtime.MemProfileRate)
	}
}
