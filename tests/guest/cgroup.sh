# Sourced by init.sh: memory cgroups and the cases that run workloads in
# them (OOM kills, reclaim, swap, usage and pressure warnings).

# A memory cgroup $CGROOT/mt-NAME limited to LIMIT: NAME LIMIT SWAP. With
# SWAP=no its swap is limited too (memsw in v1, swap.max in v2).
mk_memcg() {
    cg=$CGROOT/mt-$1
    mkdir "$cg"
    if [ $CG = v1 ]; then
        # Before 5.11 a v1 group's children count against its limit only
        # with use_hierarchy (set before they exist).
        [ -f "$cg/memory.use_hierarchy" ] && echo 1 >"$cg/memory.use_hierarchy" 2>/dev/null
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

# Once the background memtrace is up, runs CMD in the group DIR and waits
# for it (its pid and exit status then in $wpid and $wrc), then SECS more for
# the last events to come: DIR SECS CMD
work_in() {
    wpid=0
    wrc=0
    kill -0 $tp 2>/dev/null || return 0
    sh -c "echo \$\$ >$1/cgroup.procs && exec $3" >/dev/null &
    wpid=$!
    wait $wpid
    wrc=$?
    sleep "$2"
}

# The group mt-CASE (mk_memcg), then `memtrace TOOL --json -v ARGS` in the
# background: LIMIT SWAP CASE TOOL ARGS...
bg_in_memcg() {
    mk_memcg "$3" "$1" "$2"
    n=$3
    tool=$4
    shift 4
    start_bg "$n" "$tool" --json -v "$@"
}

# A memcg OOM kill traced by `memtrace TOOL --json -v ARGS`: CASE TOOL ARGS...
oom_case() {
    bg_in_memcg 64M no "$@"
    work_in "$cg" 1 "memtrace-workload alloc 200"
    stop_bg
    # The workload must have been SIGKILLed (128 + 9).
    [ "$rc" = 0 ] && [ "$wrc" = 137 ] || FAILED=1
}

# `memtrace TOOL --json -v ARGS` while `memtrace-workload swap 64` runs in a
# 32 MiB memcg that may swap. Once the workload has touched its pages, the
# limit is lifted; it counts those in swap and reads them all back: exactly
# that many swap-ins. CASE TOOL ARGS...
swap_case() {
    bg_in_memcg 32M yes "$@"
    wpid=0
    wrc=-1
    if kill -0 $tp 2>/dev/null; then
        rm -f /tmp/go
        mkfifo /tmp/go
        sh -c "echo \$\$ >$cg/cgroup.procs && exec memtrace-workload swap 64" \
            </tmp/go >/tmp/$name.w &
        wpid=$!
        # Opening the fifo lets the workload's stdin open; a line on it
        # lets the workload read its pages back. Read-write, so the open
        # never waits (and no signal can interrupt it).
        exec 3<>/tmp/go
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
    work_in "$cg/kid" 2 "memtrace-workload steps 4 40 100"
    # The last table reads the kid's files: it goes after memtrace.
    parent=$cg
    cg=$cg/kid
    stop_bg
    rmdir "$parent"
    [ "$rc" = 0 ] && [ "$wrc" = 137 ] || FAILED=1
}

# memcg --heap: the workload grows 1 MiB from malloc every 10 ms in a
# 64 MiB group until it is OOM-killed; the kill's report says what it held.
heap_case() {
    bg_in_memcg 64M no heap memcg --cgroup /mt-heap --heap
    # Where memtrace loads its shim (x86_64), the workload allocates once
    # it is in: under emulation it comes late. arm64 takes uprobes, which
    # the workload cannot see go on: it grows slower there.
    wait="env MEMTRACE_WAIT_SHIM_MS=60000 "
    pace=10
    [ "$(uname -m)" = x86_64 ] || { wait=""; pace=30; }
    work_in "$cg" 1 "${wait}memtrace-workload heap-steps 1 1000 $pace"
    stop_bg
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
    work_in "$cg" 2 "memtrace-workload steps 8 40 100"
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
