#!/bin/sh
# /init of the kernel-matrix guest (cargo xtask test --kernels). Drives the
# real memtrace binary against real workloads and prints its output on the
# serial console, one "MT-" line at a time; xtask/src/kernels/check.rs
# parses and checks it. Lines:
#   MT-INFO key=value ...
#   MT-OUT CASE LINE      memtrace's stdout
#   MT-ERR CASE LINE      memtrace's stderr
#   MT-WORK CASE LINE     the workload's own report (what it did)
#   MT-CASE CASE rc=N wrc=N wpid=N ms=N ...   (wrc/wpid: the workload's)
#   MT-SKIP CASE REASON   the case cannot run on this guest, and why
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
# Files whose faults go through filemap_fault (tmpfs has its own fault
# handler), with no fault-around: each page read is one fault.
mkdir -p /mnt/ram && mount -t ramfs ramfs /mnt/ram
echo 4096 >/sys/kernel/debug/fault_around_bytes

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

# Swap on zram (the modules xtask put in, in dependency order); turned on
# only for the swap cases, so the OOM cases cannot swap instead.
KMOD=/lib/modules/$(uname -r)
ZRAM=no
for m in $(cat "$KMOD/order" 2>/dev/null); do
    insmod "$KMOD/$m.ko" || echo "MT-INFO insmod $m failed"
done
if [ -e /sys/block/zram0 ] && echo 256M >/sys/block/zram0/disksize &&
    mkswap /dev/zram0 >/dev/null; then
    ZRAM=yes
fi
echo "MT-INFO kernel=$(uname -r) cgroup=$CG cpus=$(nproc) zram=$ZRAM"

FAILED=0

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

# A memory cgroup $CGROOT/mt-NAME limited to LIMIT: NAME LIMIT SWAP. With
# SWAP=no its swap is limited too (memsw in v1, swap.max in v2).
mk_memcg() {
    cg=$CGROOT/mt-$1
    mkdir "$cg"
    if [ $CG = v1 ]; then
        echo "$2" >"$cg/memory.limit_in_bytes"
        if [ "$3" = no ] && [ -f "$cg/memory.memsw.limit_in_bytes" ]; then
            echo "$2" >"$cg/memory.memsw.limit_in_bytes"
        fi
    else
        echo "$2" >"$cg/memory.max"
        if [ "$3" = no ] && [ -f "$cg/memory.swap.max" ]; then
            echo 0 >"$cg/memory.swap.max"
        fi
    fi
}

lift_memcg() {
    if [ $CG = v1 ]; then
        echo -1 >"$cg/memory.limit_in_bytes"
    else
        echo max >"$cg/memory.max"
    fi
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
    while ! grep -q '^Tracing' /tmp/$name.err; do
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

# Removes the case's group and prints the case's lines.
report_bg() {
    rmdir "$cg"
    emit "$name" /tmp/$name.out MT-OUT
    emit "$name" /tmp/$name.err MT-ERR
    emit "$name" /tmp/$name.w MT-WORK
    echo "MT-CASE $name rc=$rc wrc=$wrc wpid=$wpid ms=$((t1 - t0)) attach_ms=$((t_att - t0)) exit_ms=$((t1 - t_int))"
}

# A memcg OOM kill traced by `memtrace TOOL --json -v ARGS`: CASE TOOL ARGS...
oom_case() {
    mk_memcg "$1" 64M no
    n=$1
    tool=$2
    shift 2
    start_bg "$n" "$tool" --json -v "$@"
    wpid=0
    wrc=0
    if kill -0 $tp 2>/dev/null; then
        sh -c "echo \$\$ >$cg/cgroup.procs && exec memtrace-workload alloc 200" &
        wpid=$!
        wait $wpid
        wrc=$?
        sleep 1
    fi
    stop_bg
    # The workload must have been SIGKILLed (128 + 9).
    [ "$rc" = 0 ] && [ "$wrc" = 137 ] || FAILED=1
}

# `memtrace TOOL --json -v ARGS` while `memtrace-workload swap 64` runs in a
# 32 MiB memcg that may swap. Once the workload has touched its pages, the
# limit is lifted; it counts those in swap and reads them all back: exactly
# that many swap-ins. CASE TOOL ARGS...
swap_case() {
    mk_memcg "$1" 32M yes
    n=$1
    tool=$2
    shift 2
    start_bg "$n" "$tool" --json -v "$@"
    wpid=0
    wrc=-1
    if kill -0 $tp 2>/dev/null; then
        rm -f /tmp/go
        mkfifo /tmp/go
        sh -c "echo \$\$ >$cg/cgroup.procs && exec memtrace-workload swap 64" \
            </tmp/go >/tmp/$name.w &
        wpid=$!
        # Opening the fifo lets the workload's stdin open; a line on it
        # lets the workload read its pages back.
        exec 3>/tmp/go
        i=0
        while ! grep -qs '^touched' /tmp/$name.w && kill -0 $wpid 2>/dev/null &&
            [ $i -lt 1200 ]; do
            i=$((i + 1))
            usleep 100000
        done
        lift_memcg
        echo go >&3
        exec 3>&-
        wait $wpid
        wrc=$?
        sleep 1
    fi
    stop_bg
    [ "$rc" = 0 ] && [ "$wrc" = 0 ] || FAILED=1
}

# memcg: the limit set on mt-memcg, the workload in mt-memcg/kid growing
# 4 MiB per 100 ms to 160 MiB: warned at 75% of 64 MiB, then OOM-killed.
memcg_case() {
    mk_memcg memcg 64M no
    # v2: the kid is a memory cgroup only with the controller enabled for it.
    [ $CG = v1 ] || echo +memory >"$cg/cgroup.subtree_control"
    mkdir "$cg/kid"
    start_bg memcg memcg --json -v --cgroup /mt-memcg/kid --warn 75
    wpid=0
    wrc=0
    if kill -0 $tp 2>/dev/null; then
        sh -c "echo \$\$ >$cg/kid/cgroup.procs && exec memtrace-workload steps 4 40 100" \
            >/dev/null &
        wpid=$!
        wait $wpid
        wrc=$?
        sleep 2
    fi
    # The last table reads the kid's files: it goes after memtrace.
    parent=$cg
    cg=$cg/kid
    stop_bg
    rmdir "$parent"
    [ "$rc" = 0 ] && [ "$wrc" = 137 ] || FAILED=1
}

# Can this guest run a PSI case (memory.pressure triggers)? If not, the
# case is skipped with the reason: CASE
psi_here() {
    if [ $CG != v2 ]; then
        echo "MT-SKIP $1 cgroup v1 guest: memory cgroups have no memory.pressure (PSI triggers need cgroup v2)"
        return 1
    fi
    if [ ! -e /proc/pressure/memory ]; then
        echo "MT-SKIP $1 no PSI in this kernel (CONFIG_PSI off, or psi=0 on its command line)"
        return 1
    fi
}

# Pressure before the OOM kill: memory.max 128 MiB, memory.high 120 MiB.
# Over memory.high the kernel throttles the workload (a sleep counted as a
# memory stall: PSI some and full), then memory.max has it OOM-killed. The
# workload grows 8 MiB per 100 ms toward 320 MiB.
psi_case() {
    psi_here psi || return 0
    mk_memcg psi 128M no
    echo 120M >"$cg/memory.high"
    start_bg psi memcg --json -v --cgroup /mt-psi --warn-pressure some:10
    wpid=0
    wrc=0
    if kill -0 $tp 2>/dev/null; then
        sh -c "echo \$\$ >$cg/cgroup.procs && exec memtrace-workload steps 8 40 100" \
            >/dev/null &
        wpid=$!
        wait $wpid
        wrc=$?
        sleep 2
    fi
    stop_bg
    [ "$rc" = 0 ] && [ "$wrc" = 137 ] || FAILED=1
}

# --fail on a pressure warning: memory.high 32 MiB throttles a workload that
# holds 64 MiB, hard (a full stall); memtrace exits 3 by itself, then the
# workload is killed.
psi_fail_case() {
    psi_here psi-fail || return 0
    mk_memcg psi-fail 128M no
    echo 32M >"$cg/memory.high"
    start_bg psi-fail memcg --json -v --cgroup /mt-psi-fail --warn-pressure full:5 --fail
    wpid=0
    wrc=0
    if kill -0 $tp 2>/dev/null; then
        sh -c "echo \$\$ >$cg/cgroup.procs && exec memtrace-workload hold 64" \
            >/dev/null &
        wpid=$!
        t_int=$(now_ms)
        reap_bg
        kill -KILL $wpid
        wait $wpid
        wrc=$?
        report_bg
    else
        stop_bg
    fi
    [ "$rc" = 3 ] || FAILED=1
}

# --warn on page cache, which is no RSS change (so no warning at an
# allocation): 70 MiB written to a ramfs file in a 128 MiB group, --warn 50
# (64 MiB). v1: the kernel's threshold notifier; v2: a memory.events change
# (memory.high at 66 MiB) or a sample. --fail exits 3.
warn_fail_case() {
    mk_memcg warn-fail 128M no
    [ $CG = v1 ] || echo 66M >"$cg/memory.high"
    start_bg warn-fail memcg --json -v --cgroup /mt-warn-fail --warn 50 --fail
    wpid=0
    wrc=0
    if kill -0 $tp 2>/dev/null; then
        sh -c "echo \$\$ >$cg/cgroup.procs && exec dd if=/dev/zero of=/mnt/ram/warn-fail bs=1M count=70" \
            2>/dev/null &
        wpid=$!
        wait $wpid
        wrc=$?
        t_int=$(now_ms)
        reap_bg
        rm -f /mnt/ram/warn-fail
        report_bg
    else
        stop_bg
    fi
    [ "$rc" = 3 ] && [ "$wrc" = 0 ] || FAILED=1
}

run_case doctor 300 0 doctor
# With --stack: the victim triggered its own kill, so the stack is its own,
# by kprobe (before the kill is sent) and by the tracepoint (after it: the
# victim's maps were read while it failed reclaim).
oom_case oom-best oomkill --stack
oom_case oom-fentry oomkill --attach fentry
oom_case oom-tp_btf oomkill --attach tp_btf
oom_case oom-tracepoint oomkill --attach tracepoint --stack
# The memcg reclaim the kernel tries before that OOM kill, seen by drsnoop.
oom_case drsnoop drsnoop
memcg_case
warn_fail_case
psi_case
psi_fail_case
# The workload's own faults (start-up, exit), then with 2000 more.
run_case faults-base 300 0 faults -c 'memtrace-workload touch 0' --json -v
run_case faults 300 0 faults -c 'memtrace-workload touch 2000' --json -v
run_case brkstack 300 0 brkstack -c 'memtrace-workload rawbrk 50 4096' --json -v
# Every fault's stack unwound with DWARF in the program (the verifier of
# each kernel must accept the unwinder's loops).
run_case faults-dwarf 300 0 faults --stacks --stack-mode dwarf --unwinder kernel \
    -c 'memtrace-workload touch 2000' --json -v
# Two tracepoints told apart by attach cookie (Linux 5.15 and later).
run_case count 300 0 count syscalls:sys_enter_madvise syscalls:sys_enter_munmap \
    --json -v -c 'memtrace-workload madvise 30 8192'
# One line per matching call, the filter tested in the kernel.
run_case trace 300 0 trace syscalls:sys_enter_madvise --filter 'len_in == 8192' \
    --json -v -c 'memtrace-workload madvise 20 4096 8192'
# Uprobes on the guest's own libc, placed where its kernel emulates them:
# 7 x 1000 B and 3 x 1 MiB held, 200 rounds of every allocator freed.
run_case memleak 300 0 memleak --json -v \
    -c 'memtrace-workload leak 7 1000 3 1048576 200 0'
dd if=/dev/zero of=/mnt/ram/ffaults bs=4096 count=310 2>/dev/null
run_case ffaults 300 0 ffaults --json -v \
    -c 'memtrace-workload readfile /mnt/ram/ffaults 300 500'
# Four steps of 16 MiB: 40 MiB is crossed during the third; --fail exits 3.
run_case rss 300 3 rss --threshold 40MiB --fail --json -v -i 200ms \
    -c 'memtrace-workload steps 16 4 300'
dd if=/dev/zero of=/mnt/ram/mmapsnoop bs=4096 count=3 2>/dev/null
run_case mmapsnoop 300 0 mmapsnoop --json -v \
    -c 'memtrace-workload maps /mnt/ram/mmapsnoop >/tmp/mmapsnoop.w'
run_case shmsnoop 300 0 shmsnoop --json -v \
    -c 'memtrace-workload shm >/tmp/shmsnoop.w'
if [ $ZRAM = yes ] && swapon /dev/zram0; then
    # One report, at the end: a count added just as an interval report
    # takes its key can be lost (as for faults --slots 0; 1 of about 8400
    # was, once), and this check is exact.
    swap_case swapin-best swapin -i 600
    swap_case swapin-kprobe swapin -i 600 --attach kprobe
    swap_case swapin-fentry swapin -i 600 --attach fentry
    # The memcg reclaim that swaps those pages out, by process.
    swap_case vmscan vmscan -P
    swapoff /dev/zram0
else
    echo "MT-INFO no swap: swapin and vmscan not run"
    FAILED=1
fi

if [ $FAILED = 0 ]; then echo "MT-END PASS"; else echo "MT-END FAIL"; fi
sync
poweroff -f
