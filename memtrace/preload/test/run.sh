#!/usr/bin/env bash
# The allocator shim's C test (shim_test.c) under AddressSanitizer and
# ThreadSanitizer: `bash memtrace/preload/test/run.sh`, from anywhere. CC
# picks the compiler (gcc or clang; cc by default), which needs its
# sanitizer runtimes (Debian: gcc, which brings libasan8 and libtsan2).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$here/.."
cc="${CC:-cc}"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/shim-test.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# build.rs's sources and flags, less -shared, -fPIC and -Bsymbolic.
srcs=(memtrace_preload.c compose.c cxx.c jemalloc.c frees.c memo.c sampled.c sites.c)
flags=(-g -O1 -fno-omit-frame-pointer -fvisibility=hidden -Wall -Werror -DMEMTRACE_SHIM_TEST)
# What the shim interposes, renamed: in the executable these would take
# the place of the sanitizer's own (its malloc, dlsym, mmap, new).
renames=()
for f in malloc free calloc realloc reallocarray memalign aligned_alloc posix_memalign valloc \
  pvalloc mmap mmap64 munmap dlsym execve fexecve execvpe execvp execv posix_spawn posix_spawnp \
  _Znwm _Znam _ZnwmRKSt9nothrow_t _ZnamRKSt9nothrow_t _ZnwmSt11align_val_t _ZnamSt11align_val_t \
  _ZnwmSt11align_val_tRKSt9nothrow_t _ZnamSt11align_val_tRKSt9nothrow_t _ZdlPv _ZdaPv _ZdlPvm \
  _ZdaPvm _ZdlPvRKSt9nothrow_t _ZdaPvRKSt9nothrow_t _ZdlPvSt11align_val_t _ZdaPvSt11align_val_t \
  _ZdlPvmSt11align_val_t _ZdaPvmSt11align_val_t _ZdlPvSt11align_val_tRKSt9nothrow_t \
  _ZdaPvSt11align_val_tRKSt9nothrow_t; do
  renames+=("-D$f=shim_$f")
done
# gcc warns that TSan does not model memo.c's fences: its slot reads are
# atomic, so TSan sees no race there either way.
no_tsan_warning=()
if "$cc" -Werror -Wno-tsan -x c -c -o /dev/null /dev/null 2>/dev/null; then
  no_tsan_warning=(-Wno-tsan)
fi

# Builds and runs the test under sanitizer $1 in $2; its output in $2/log.
run() {
  local san=$1 out=$2 extra=()
  [[ $san == thread ]] && extra=("${no_tsan_warning[@]}")
  for s in "${srcs[@]}" test/shim_test.c; do
    local r=("${renames[@]}")
    [[ $s == test/* ]] && r=()
    "$cc" "${flags[@]}" "${extra[@]}" -fsanitize="$san" "${r[@]}" -c "$src/$s" \
      -o "$out/$(basename "${s%.c}").o" || return 1
  done
  "$cc" -fsanitize="$san" -o "$out/shim_test" "$out"/*.o -lm -pthread || return 1
  # Any report fails the run. Leaks are not the test's (and LSan fails
  # under ptrace).
  export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:exitcode=66
  export TSAN_OPTIONS=halt_on_error=1:exitcode=66
  "$out/shim_test" >"$out/stdout" && return 0
  # Older TSan runtimes refuse the address layout of high ASLR entropy.
  grep -q 'unexpected memory mapping' "$out/log" || return 1
  setarch "$(uname -m)" -R "$out/shim_test" >"$out/stdout"
}

passed=0 failed=0
for san in address thread; do
  out="$tmp/$san"
  mkdir -p "$out"
  if run "$san" "$out" 2>"$out/log" && ! grep -q 'Sanitizer' "$out/log"; then
    echo "$san: pass ($(paste -sd ';' "$out/stdout" | sed 's/;/; /g'))"
    passed=$((passed + 1))
  else
    echo "$san: FAIL"
    cat "$out/log" "$out/stdout" 2>/dev/null | head -60 | sed 's/^/  /' || true
    failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
((failed == 0))
