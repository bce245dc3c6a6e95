// The Go workload: hoard() keeps BLOCKS blocks of 64 KiB, touching each
// page, from one function; `wait` then holds them until stdin closes (a
// handshake for -p: "held N" on stdout once the blocks are kept).
package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
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
	n := 1000
	if len(os.Args) > 1 {
		n, _ = strconv.Atoi(os.Args[1])
	}
	hoard(n)
	fmt.Println("held", len(kept))
	if len(os.Args) > 2 && os.Args[2] == "wait" {
		io.Copy(io.Discard, os.Stdin)
	}
}
