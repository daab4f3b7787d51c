#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the C++ core (src_cpp without the Python bindings) and the stress
# test tests/cpp/connector_stress.cc under a sanitizer, then runs the test;
# or (asan-python) the Python extension itself, bindings.cc included, and runs
# tests/sanitizers/bindings_driver.py on it: the frame fuzzer in-process and
# against a live gateway (the same sanitized build), and every bound class.
# Any sanitizer report or failed check makes the exit code non-zero.
#
#   scripts/sanitize.sh asan|tsan|asan-python [card_dir]
#
# asan = AddressSanitizer + UndefinedBehaviorSanitizer, tsan = ThreadSanitizer.
# asan-python: ASan + UBSan with libasan preloaded into python and
# PYTHONMALLOC=malloc (so bytes objects handed to the binding are ASan-tracked);
# leak checking is off there (the interpreter itself keeps memory at exit).
# ADP_FUZZ_FRAMES=N sets asan-python's parser frames (default 20000; a tenth
# as many hostile connections to the gateway).
# ADP_STRESS_SCALE=N multiplies the stress test's work (default 1), for soak runs.
# card_dir holds the test's card image (a 48 MiB file, removed afterwards) and
# must support O_DIRECT; default /dev/shm (tmpfs has O_DIRECT since Linux 6.6),
# else build/sanitize. Objects and the binary go to build/sanitize/<mode>/, and
# a run reuses the objects there that are up to date, judged as setup.py's
# build judges its own (scripts/object_stamps.py: the same compile command,
# the same content of the source and of every header it read): a second run
# with nothing changed compiles nothing. One build at a time per mode (a lock,
# build/sanitize/<mode>/build.lock, over the compile and the link); every file
# is written under a temporary name and renamed.
set -euo pipefail

mode=${1:-}
case "$mode" in
  asan | asan-python) san=(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer) ;;
  tsan) san=(-fsanitize=thread) ;;
  *)
    echo "usage: $0 asan|tsan|asan-python [card_dir]" >&2
    exit 2
    ;;
esac

cd "$(dirname "$0")/.."
out=build/sanitize/$mode
mkdir -p "$out"
card_dir=${2:-/dev/shm}
[ -n "${2:-}" ] || [ -w /dev/shm ] || card_dir=$out
CXX=${CXX:-g++}
# tests/support/cpp.py's sanitize_flags() is this, word for word, for asan and tsan: the test suite's sanitized test
# programs reuse these objects (build/sanitize/<mode>, under the lock below), so a change here goes there too.
flags=(-std=c++20 -g -O1 -D_GLIBCXX_ASSERTIONS "${san[@]}" -Wall -Wextra -Werror -Wno-missing-field-initializers -Isrc_cpp -pthread)
PYTHON=${PYTHON:-python}
if [ "$mode" = asan-python ]; then
  mapfile -t sources < <(find src_cpp -name '*.cc' | sort)
  if ! "$PYTHON" -c 'import pybind11' 2>/dev/null; then
    echo "sanitize.sh asan-python: $PYTHON has no pybind11 (pip install -e '.[test]' installs it)" >&2
    exit 1
  fi
  mapfile -t pyinc < <("$PYTHON" -c 'import sysconfig, pybind11; print(sysconfig.get_paths()["include"]); print(pybind11.get_include())')
  flags+=(-fPIC -fvisibility=hidden -I"${pyinc[0]}" -I"${pyinc[1]}")
  # The sources' digest, as setup.py records it (_native.SOURCE_DIGEST, in a generated translation unit
  # bindings.cc links against): benchmarks/tools.native_build() then judges this build by content like any
  # other, instead of calling it stale for want of one.
  "$PYTHON" -c 'import runpy, sys; m = runpy.run_path("lmcache_adp/source_digest.py")
open(sys.argv[1], "w").write(m["digest_unit"](m["source_digest"](".")))' "$out/adp_source_digest.cc.$$"
  mv "$out/adp_source_digest.cc.$$" "$out/adp_source_digest.cc"
  sources+=("$out/adp_source_digest.cc")
else
  mapfile -t sources < <(find src_cpp -name '*.cc' ! -path src_cpp/python/bindings.cc | sort)
  sources+=(tests/cpp/connector_stress.cc)
fi

start=$SECONDS
exec 9>"$out/build.lock"
flock 9
# One compiler per core (ADP_BUILD_JOBS), the objects not up to date only.
mapfile -t objs < <(ADP_BUILD_JOBS=${ADP_BUILD_JOBS:-$(nproc)} "$PYTHON" scripts/object_stamps.py \
  "$out" "$CXX" "${flags[@]}" -- "${sources[@]}" || echo FAILED)
if [ "${#objs[@]}" -ne "${#sources[@]}" ]; then
  echo "sanitize.sh: the $mode build failed" >&2
  exit 1
fi
# The link, unless what is there was linked by the same command from objects of the same content.
if [ "$mode" = asan-python ]; then
  suffix=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  linked=$out/_native$suffix
  link=(-shared)
else
  linked=$out/connector_stress
  link=()
fi
link_id=$({ printf '%s\n' "$CXX" "${flags[@]}" "${link[@]}"; sha256sum "${objs[@]}"; } | sha256sum)
if [ -f "$linked" ] && [ "$(cat "$linked.stamp" 2>/dev/null)" = "$link_id" ]; then
  what="up to date"
else
  rm -f "$linked.stamp"
  "$CXX" "${flags[@]}" "${link[@]}" "${objs[@]}" -o "$linked.$$"
  mv "$linked.$$" "$linked"
  echo "$link_id" >"$linked.stamp.$$" && mv "$linked.stamp.$$" "$linked.stamp"
  what=linked
fi
if [ "$mode" = asan-python ]; then
  # The package as installed, with the sanitized extension in place of the normal one.
  pkg=$out/py/lmcache_adp
  rm -rf "$out/py" && mkdir -p "$out/py"
  cp -r lmcache_adp "$pkg"
  rm -f "$pkg"/_native*.so
  cp "$linked" "$pkg/_native$suffix"
fi
exec 9>&-
echo "sanitize.sh: built $linked ($mode; $what) in $((SECONDS - start)) s"

card=$card_dir/adp-sanitize-$mode-$$.img
rm -f "$card"
trap 'rm -f "$card"' EXIT

# Stop at the first report; our settings come last so they win over the caller's.
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}halt_on_error=1:abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}halt_on_error=1:abort_on_error=1:print_stacktrace=1
export TSAN_OPTIONS=${TSAN_OPTIONS:+$TSAN_OPTIONS:}halt_on_error=1:abort_on_error=1:second_deadlock_stack=1
export ADP_LOG_LEVEL=${ADP_LOG_LEVEL:-WARNING}
ulimit -c 0  # abort_on_error must not leave core files behind

run=()
# TSan's fixed shadow layout clashes with the high mmap randomisation of newer
# kernels ("FATAL: ThreadSanitizer: unexpected memory mapping"); running with
# ASLR off avoids it. setarch may be refused in some containers: then run as is.
if [ "$mode" = tsan ] && setarch "$(uname -m)" -R true 2>/dev/null; then
  run=(setarch "$(uname -m)" -R)
fi

start=$SECONDS
status=0
if [ "$mode" = asan-python ]; then
  work=$(mktemp -d /tmp/adp-sanitize-py-XXXXXX)  # short: it holds a Unix socket
  trap 'rm -f "$card"; rm -rf "$work"' EXIT
  root=$PWD
  # From $work, so that the tree's own lmcache_adp (a normal build) is not on
  # the path ahead of the sanitized one; the driver appends the tree for tests.*.
  # libstdc++ preloaded too: python does not link it, and ASan's __cxa_throw
  # interceptor must find the real one at startup ("real___cxa_throw != 0").
  # -print-file-name echoes the bare name when it finds no such file (or names a link that is dangling: no unversioned
  # libstdc++.so link, e.g. Ubuntu 24.04's g++ 13 on the 16-core machine): then the runtime's own soname.
  lib() { local f; for f in "$@"; do f=$("$CXX" -print-file-name="$f"); [ "${f#/}" != "$f" ] && [ -e "$f" ] && { echo "$f"; return; }; done
    echo "sanitize.sh asan-python: $CXX knows no $* to preload" >&2; exit 1; }
  preload="$(lib libasan.so libasan.so.8) $(lib libstdc++.so libstdc++.so.6)"
  (cd "$work" &&
    ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0 LD_PRELOAD=$preload PYTHONMALLOC=malloc \
      PYTHONPATH=$root/$out/py ADP_SANITIZED_PREFIX=$root/$out/py ADP_LOG_LEVEL=INFO \
      "$PYTHON" "$root/tests/sanitizers/bindings_driver.py" "$work" "${ADP_FUZZ_FRAMES:-20000}") || status=$?
  echo "sanitize.sh: $mode run exited $status in $((SECONDS - start)) s"
  exit "$status"
fi
"${run[@]}" "$out/connector_stress" "$card" "${ADP_STRESS_SCALE:-1}" || status=$?
echo "sanitize.sh: $mode run exited $status in $((SECONDS - start)) s"
exit "$status"
