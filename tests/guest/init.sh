#!/bin/sh
# /init of the kernel-matrix guest (cargo xtask test --kernels). Drives the
# real memtrace binary against real workloads and prints its output on the
# serial console, one "MT-" line at a time; xtask/src/kernels/check.rs
# parses and checks it. The cases are in the scripts sourced below
# (lib.sh, cgroup.sh, live.sh, put in /lib/guest by xtask). Lines:
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

. /lib/guest/lib.sh
. /lib/guest/cgroup.sh
. /lib/guest/live.sh

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
heap_case
warn_fail_case
psi_case
psi_fail_case
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

# Each populated zone compacted once by one write from the shell.
run_case compactsnoop 300 0 compactsnoop --json -v -c 'echo 1 > /proc/sys/vm/compact_memory'
# The workload's own faults (start-up, exit), then with 2000 more.
run_case faults-base 300 0 faults -c 'memtrace-workload touch 0' --json -v
run_case faults 300 0 faults -c 'memtrace-workload touch 2000' --json -v
run_case brkstack 300 0 brkstack -c 'memtrace-workload rawbrk 50 4096' --json -v
# Every fault's stack unwound with DWARF in the program (the verifier of
# each kernel must accept the unwinder's loops). Without bpf_loop (before
# 5.17) memtrace refuses, exit 2, as it says. On arm64, whose registers the
# unwinder program does not walk yet, the stacks are copied and unwound by
# memtrace instead, as it says.
if grep -q ' bpf_loop$' /proc/kallsyms; then DWARF_RC=0; else DWARF_RC=2; fi
# The buffer holds every copy (2000 of up to 16 KiB) should memtrace's
# reader fall behind the emulated workload.
run_case faults-dwarf 300 $DWARF_RC faults --stacks --stack-mode dwarf --unwinder kernel \
    --buffer-size 32M -c 'memtrace-workload touch 2000' --json -v
# Two tracepoints told apart by attach cookie (Linux 5.15 and later).
run_case count 300 0 count syscalls:sys_enter_madvise syscalls:sys_enter_munmap \
    --json -v -c 'memtrace-workload madvise 30 8192'
# One line per matching call, the filter tested in the kernel.
run_case trace 300 0 trace syscalls:sys_enter_madvise --filter 'len_in == 8192' \
    --json -v -c 'memtrace-workload madvise 20 4096 8192'
# Uprobes on the guest's own libc, placed where its kernel emulates them:
# 7 x 1000 B and 3 x 1 MiB held, 200 rounds of every allocator freed.
run_case memleak 300 0 memleak --json -v --no-preload \
    -c 'memtrace-workload leak 7 1000 3 1048576 200 0'
# Where the kernel's walker takes user stacks (no bpf_loop), 20 runs of it,
# none losing a stack: its stack map's buckets once lost one run in some
# tens, and memtrace now keeps those stacks by their own hash.
if [ "$DWARF_RC" = 2 ]; then
    run_repeat memleak-repeat 20 300 memleak --json --no-preload \
        -c 'memtrace-workload leak 7 1000 3 1048576 20 0'
else
    echo "MT-SKIP memleak-repeat user stacks walked by memtrace's own program here (bpf_loop)"
fi
# The same through the allocator shim memleak preloads into a -c command.
run_case memleak-shim 300 0 memleak --json -v \
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
top_case
serve_case
# Recorded, then read back (report) and compared (diff): the known brk
# stack, then it again with 20 more calls and a new one below it.
run_case record-a 300 0 brkstack -c 'memtrace-workload rawbrk 40 4096' \
    --json -v --record /tmp/a.rec
run_case record-b 300 0 brkstack -c 'memtrace-workload rawbrk-deep 60 3 5' \
    --json -v --record /tmp/b.rec
run_case report 60 0 report --json /tmp/a.rec
run_case diff 60 0 diff --json /tmp/a.rec /tmp/b.rec

if [ $FAILED = 0 ]; then echo "MT-END PASS"; else echo "MT-END FAIL"; fi
sync
poweroff -f
