// The Go service of `cargo xtask bench --only go`: a net/http server on
// 127.0.0.1:18080 whose handler allocates 1 to 16 KiB per request and keeps
// the last 10,000 of them (a live heap of about 80 MiB, turning over), as a
// cache does. It does not import runtime/pprof: its linker leaves heap
// profiling off, as in most services, and memleak turns it on.
package main

import (
	"net/http"
	"sync"
)

const keep = 10000

var (
	mu    sync.Mutex
	ring  [keep][]byte
	next  int
	reply = []byte("ok\n")
)

//go:noinline
func remember(n int) {
	b := make([]byte, n)
	for i := 0; i < n; i += 4096 {
		b[i] = 1
	}
	mu.Lock()
	ring[next%keep] = b
	next++
	mu.Unlock()
}

func handle(w http.ResponseWriter, r *http.Request) {
	mu.Lock()
	n := 1024 + (next*7919)%(15*1024)
	mu.Unlock()
	remember(n)
	w.Write(reply)
}

func main() {
	http.HandleFunc("/", handle)
	if err := http.ListenAndServe("127.0.0.1:18080", nil); err != nil {
		panic(err)
	}
}
