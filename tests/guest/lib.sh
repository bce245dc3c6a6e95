# Sourced by init.sh: running memtrace in the guest, in the foreground or
# in the background, and printing a case's MT- lines.

# Milliseconds since boot.
now_ms() {
    read -r up _ </proc/uptime
    # "1" before the hundredths: "08" alone would be a bad octal number.
    echo $((${up%.*} * 1000 + 10 * 1${up#*.} - 1000))
}

emit() { # CASE FILE TAG
    [ -f "$2" ] || return 0
    while IFS= read -r l; do echo "$3 $1 $l"; done <"$2"
}

# Runs memtrace to completion with a hard timeout: CASE SECS WANT_RC ARGS...
run_case() {
    name=$1
    secs=$2
    want=$3
    shift 3
    rm -f /tmp/$name.w
    t0=$(now_ms)
    timeout -s KILL "$secs" memtrace "$@" >/tmp/$name.out 2>/tmp/$name.err
    rc=$?
    t1=$(now_ms)
    emit "$name" /tmp/$name.out MT-OUT
    emit "$name" /tmp/$name.err MT-ERR
    emit "$name" /tmp/$name.w MT-WORK
    echo "MT-CASE $name rc=$rc wrc=0 wpid=0 ms=$((t1 - t0))"
    [ "$rc" = "$want" ] || FAILED=1
}

# The same run COUNT times, the runs' lines one after another (each JSON
# run ends in its summary); the status is the last failing run's:
# CASE COUNT SECS ARGS...
run_repeat() {
    name=$1
    count=$2
    secs=$3
    shift 3
    rm -f /tmp/$name.out /tmp/$name.err /tmp/$name.w
    t0=$(now_ms)
    rc=0
    i=0
    while [ $i -lt "$count" ]; do
        timeout -s KILL "$secs" memtrace "$@" >>/tmp/$name.out 2>>/tmp/$name.err || rc=$?
        i=$((i + 1))
    done
    t1=$(now_ms)
    emit "$name" /tmp/$name.out MT-OUT
    emit "$name" /tmp/$name.err MT-ERR
    echo "MT-CASE $name rc=$rc wrc=0 wpid=0 ms=$((t1 - t0))"
    [ "$rc" = 0 ] || FAILED=1
}

# `memtrace ARGS` in the background, until it says "Tracing" (program
# loads are slow under emulation): NAME ARGS...
start_bg() {
    name=$1
    shift
    rm -f /tmp/$name.w
    t0=$(now_ms)
    memtrace "$@" >/tmp/$name.out 2>/tmp/$name.err &
    tp=$!
    i=0
    while ! grep -qs '^Tracing' /tmp/$name.err; do
        if ! kill -0 $tp 2>/dev/null || [ $i -ge 1200 ]; then
            break
        fi
        i=$((i + 1))
        usleep 100000
    done
    t_att=$(now_ms)
}

# Ctrl-C to the background memtrace (killed after 120 s), then its lines.
stop_bg() {
    t_int=$(now_ms)
    kill -INT $tp 2>/dev/null
    reap_bg
    report_bg
}

# Waits for the background memtrace to exit (killed after 120 s).
reap_bg() {
    (sleep 120 && kill -KILL $tp) 2>/dev/null &
    dog=$!
    wait $tp
    rc=$?
    kill $dog 2>/dev/null
    t1=$(now_ms)
}

# Removes the case's group (if it has one: $cg) and prints its lines.
report_bg() {
    [ -z "$cg" ] || rmdir "$cg"
    emit "$name" /tmp/$name.out MT-OUT
    emit "$name" /tmp/$name.err MT-ERR
    emit "$name" /tmp/$name.w MT-WORK
    echo "MT-CASE $name rc=$rc wrc=$wrc wpid=$wpid ms=$((t1 - t0)) attach_ms=$((t_att - t0)) exit_ms=$((t1 - t_int))"
}

# `memtrace-workload --wait ARGS` started before memtrace, so that its
# start-up (loader, libc) is not counted: once it has printed its pid (then
# in $wpid) it waits for a line on descriptor FD, a fifo kept open here.
# FD ARGS...
held_workload() {
    fd=$1
    shift
    rm -f /tmp/go$fd /tmp/held$fd
    mkfifo /tmp/go$fd
    memtrace-workload --wait "$@" </tmp/go$fd >/tmp/held$fd &
    wpid=$!
    # Read-write: a fifo so opened does not wait for its reader, so no
    # signal (a child of an earlier case exiting) can interrupt the open,
    # which ended the guest's init with EINTR once.
    eval "exec $fd<>/tmp/go$fd"
    i=0
    while ! grep -qs . /tmp/held$fd && [ $i -lt 600 ]; do
        i=$((i + 1))
        usleep 100000
    done
}
