"""Run by a `memleak -c` test (rootsafe.rs): asks memtrace's memo socket
itself, as the shim does, and says what it got and what it could do with
it: how many descriptors, whether each maps writable (it must not) and
read-only, and how many bpf-map mappings of this process are writable."""
import mmap
import os
import socket

cfg = os.environ.get("MEMTRACE_PRELOAD_SAMPLE", "")
name = cfg.split(",memo=", 1)[1] if ",memo=" in cfg else None
fds = []
if name:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect("\0" + name)
        _, fds, _, _ = socket.recv_fds(s, 1, 4)
    except OSError as e:
        print("connect failed", e)
print("fds", len(fds))
for fd in fds:
    try:
        mmap.mmap(fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        print("writable mapped")
    except OSError:
        print("writable refused")
    try:
        mmap.mmap(fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ)
        print("read-only ok")
    except OSError as e:
        print("read-only failed", e)
writable = 0
with open("/proc/self/maps") as f:
    for line in f:
        parts = line.split()
        if "bpf-map" in line and "w" in parts[1]:
            writable += 1
print("bpf-map writable mappings", writable)

def memo_mappings():
    with open("/proc/self/maps") as f:
        return sum(1 for l in f if "bpf-map" in l or "memtrace-unwind-gen" in l)


# A root daemon's worker that drops root without an exec keeps no view of
# the memo (the shim lets go of it at the change of ids).
if os.getuid() == 0:
    print("memo mappings before setuid", memo_mappings())
    pid = os.fork()
    if pid == 0:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        print("memo mappings after setuid", memo_mappings(), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
