# Sourced by init.sh: the tools that run until stopped and show counters as
# they go (top, serve), each against a workload held until memtrace is
# attached, so that only its counted work is traced.

# top in plain text (its stdout is a file): refreshes of 700 ms of one
# process, which faults 1000 fresh pages and calls brk 100 times a second
# (a page each) for 5 s. top ends with the process, its last refresh the
# part-interval since the one before.
top_case() {
    cg=
    held_workload 3 paced 1000 100 5
    start_bg top top -v -p "$wpid" -i 700ms
    echo go >&3
    exec 3>&-
    t_int=$(now_ms)
    reap_bg
    wait "$wpid"
    wrc=$?
    report_bg
    [ "$rc" = 0 ] && [ "$wrc" = 0 ] || FAILED=1
}

# serve, scraped with busybox wget once two workloads are done: `counted
# 3000 40 25` (3000 fresh pages, 40 mmap calls of 8 KiB, 25 brk calls of a
# page) and the same doing nothing, whose faults on its way out are the
# baseline. The scrape is the case's MT-WORK, after "baseline PID".
serve_case() {
    cg=
    # Loopback (no other network: qemu -nic none).
    ip link set lo up
    url=http://127.0.0.1:9477/metrics
    held_workload 4 counted 0 0 0
    bpid=$wpid
    held_workload 3 counted 3000 40 25
    start_bg serve serve -v --listen 127.0.0.1:9477 -i 200ms --max-series 1000
    echo go >&4
    echo go >&3
    exec 3>&- 4>&-
    wait "$bpid"
    wait "$wpid"
    wrc=$?
    if kill -0 $tp 2>/dev/null; then
        # The counters are read every 200 ms: wait for the 40 mmap calls,
        # then two reads more, so that nothing is still on its way.
        i=0
        while ! wget -q -O - $url 2>/dev/null |
            grep -q "^memtrace_mmap_calls_total{pid=\"$wpid\".* 40$" &&
            [ $i -lt 100 ]; do
            i=$((i + 1))
            usleep 100000
        done
        usleep 500000
        { echo "baseline $bpid"; wget -q -O - $url; } >/tmp/serve.w
    fi
    stop_bg
    [ "$rc" = 0 ] && [ "$wrc" = 0 ] || FAILED=1
}
