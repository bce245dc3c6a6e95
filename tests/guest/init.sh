#!/bin/sh
# /init of the kernel-matrix guest (cargo xtask test --kernels). Drives the
# real memtrace binary against real workloads and prints its output on the
# serial console, one "MT-" line at a time; xtask/src/kernels.rs parses and
# checks it. Lines:
#   MT-INFO key=value ...
#   MT-OUT CASE LINE      memtrace's stdout
#   MT-ERR CASE LINE      memtrace's stderr
#   MT-CASE CASE rc=N wrc=N wpid=N ms=N   (wrc/wpid: the OOM workload's)
#   MT-END PASS|FAIL      every case ran and exited as expected, or not

/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /tmp
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
exec </dev/console >/dev/console 2>&1
# Keep kernel messages (OOM reports) off the console our lines go to.
echo 1 >/proc/sys/kernel/printk
mount -t tmpfs tmpfs /tmp
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mkdir -p /sys/fs/bpf && mount -t bpf bpf /sys/fs/bpf

# Memory cgroup: v1 where the kernel still has it (6.1), else v2 (6.12).
mount -t tmpfs cgroup /sys/fs/cgroup
mkdir -p /sys/fs/cgroup/memory
if mount -t cgroup -o memory memory /sys/fs/cgroup/memory 2>/dev/null; then
    CG=v1
    CGROOT=/sys/fs/cgroup/memory
else
    rmdir /sys/fs/cgroup/memory
    umount /sys/fs/cgroup
    mount -t cgroup2 cgroup2 /sys/fs/cgroup
    echo +memory >/sys/fs/cgroup/cgroup.subtree_control
    CG=v2
    CGROOT=/sys/fs/cgroup
fi
echo "MT-INFO kernel=$(uname -r) cgroup=$CG cpus=$(nproc)"

FAILED=0

# Milliseconds since boot.
now_ms() {
    read -r up _ </proc/uptime
    # "1" before the hundredths: "08" alone would be a bad octal number.
    echo $((${up%.*} * 1000 + 10 * 1${up#*.} - 1000))
}

emit() { # CASE FILE TAG
    while IFS= read -r l; do echo "$3 $1 $l"; done <"$2"
}

# Runs memtrace to completion with a hard timeout: CASE SECS ARGS...
run_case() {
    name=$1
    secs=$2
    shift 2
    t0=$(now_ms)
    timeout -s KILL "$secs" memtrace "$@" >/tmp/$name.out 2>/tmp/$name.err
    rc=$?
    t1=$(now_ms)
    emit "$name" /tmp/$name.out MT-OUT
    emit "$name" /tmp/$name.err MT-ERR
    echo "MT-CASE $name rc=$rc wrc=0 wpid=0 ms=$((t1 - t0))"
    [ "$rc" = 0 ] || FAILED=1
}

# A memcg OOM kill traced by `memtrace TOOL --json -v ARGS` (TOOL defaults
# to oomkill): CASE ARGS...
oom_case() {
    name=$1
    shift
    cg=$CGROOT/mt-$name
    mkdir "$cg"
    if [ $CG = v1 ]; then
        echo 64M >"$cg/memory.limit_in_bytes"
    else
        echo 64M >"$cg/memory.max"
    fi
    t0=$(now_ms)
    memtrace ${TOOL:-oomkill} --json -v "$@" >/tmp/$name.out 2>/tmp/$name.err &
    tp=$!
    # Attached once it says "Tracing"; program loads are slow under emulation.
    i=0
    while ! grep -q '^Tracing' /tmp/$name.err; do
        if ! kill -0 $tp 2>/dev/null || [ $i -ge 1200 ]; then
            break
        fi
        i=$((i + 1))
        usleep 100000
    done
    t_att=$(now_ms)
    wpid=0
    wrc=0
    if kill -0 $tp 2>/dev/null; then
        sh -c "echo \$\$ >$cg/cgroup.procs && exec memtrace-workload alloc 200" &
        wpid=$!
        wait $wpid
        wrc=$?
        sleep 1
    fi
    t_int=$(now_ms)
    kill -INT $tp 2>/dev/null
    (sleep 120 && kill -KILL $tp) 2>/dev/null &
    dog=$!
    wait $tp
    rc=$?
    kill $dog 2>/dev/null
    t1=$(now_ms)
    rmdir "$cg"
    emit "$name" /tmp/$name.out MT-OUT
    emit "$name" /tmp/$name.err MT-ERR
    echo "MT-CASE $name rc=$rc wrc=$wrc wpid=$wpid ms=$((t1 - t0)) attach_ms=$((t_att - t0)) exit_ms=$((t1 - t_int))"
    # The workload must have been SIGKILLed (128 + 9).
    [ "$rc" = 0 ] && [ "$wrc" = 137 ] || FAILED=1
}

run_case doctor 300 doctor
oom_case oom-best
oom_case oom-fentry --attach fentry
oom_case oom-tp_btf --attach tp_btf
oom_case oom-tracepoint --attach tracepoint
# The memcg reclaim the kernel tries before that OOM kill, seen by drsnoop.
TOOL=drsnoop oom_case drsnoop
run_case faults 300 faults -c 'memtrace-workload touch 2000' --json -v
run_case brkstack 300 brkstack -c 'memtrace-workload rawbrk 50 4096' --json -v

if [ $FAILED = 0 ]; then echo "MT-END PASS"; else echo "MT-END FAIL"; fi
sync
poweroff -f
