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
#   scripts/sanitize.sh asan|tsan|asan-python --flags
#
# asan = AddressSanitizer + UndefinedBehaviorSanitizer, tsan = ThreadSanitizer.
# The compile flags are scripts/sanitize_flags.py's (tests/support/cpp.py's
# sanitized test programs compile with them too, into the same directory);
# --flags prints the objects' directory and those flags, one a line, and exits.
# asan-python: ASan + UBSan with libasan preloaded into python and
# PYTHONMALLOC=malloc (so bytes objects handed to the binding are ASan-tracked);
# leak checking is off there (the interpreter itself keeps memory at exit).
# ADP_FUZZ_FRAMES=N sets asan-python's parser frames (default 20000; a tenth
# as many hostile connections to the gateway).
# ADP_STRESS_SCALE=N multiplies the stress test's work (default 1), for soak runs.
# card_dir holds the test's card image (a 48 MiB file, removed afterwards) and
# must support O_DIRECT; default /dev/shm (tmpfs has O_DIRECT since Linux 6.6),
# else build/sanitize. Objects and the binary go to build/sanitize/<mode>/
# (asan-python's: bindings.cc's and the digest unit's there, the other objects
# are asan's, compiled -fPIC for it), and
# a run reuses the objects there that are up to date, judged as setup.py's
# build judges its own (scripts/object_stamps.py: the same compile command,
# the same content of the source and of every header it read): a second run
# with nothing changed compiles nothing. One build at a time per object directory
# (a lock, build/sanitize/<asan|tsan>/build.lock, over the compile and the link;
# asan-python takes asan's); every file
# is written under a temporary name and renamed.
set -euo pipefail

mode=${1:-}
case "$mode" in
  asan | tsan | asan-python) ;;
  *)
    echo "usage: $0 asan|tsan|asan-python [card_dir|--flags]" >&2
    exit 2
    ;;
esac
base=${mode%-python}  # asan-python's objects, bindings.cc's aside, are asan's

cd "$(dirname "$0")/.."
out=build/sanitize/$mode
objdir=build/sanitize/$base
mkdir -p "$out" "$objdir"
card_dir=${2:-/dev/shm}
[ -n "${2:-}" ] || [ -w /dev/shm ] || card_dir=$out
CXX=${CXX:-g++}
PYTHON=${PYTHON:-python}
# The flags are scripts/sanitize_flags.py's, which tests/support/cpp.py reads too: the test suite's sanitized test
# programs compile with them into the same $objdir (under the lock below), so the two reuse each other's objects.
mapfile -t flags < <("$PYTHON" scripts/sanitize_flags.py "$base")
if [ "${#flags[@]}" -eq 0 ]; then
  echo "sanitize.sh: $PYTHON scripts/sanitize_flags.py $base printed no flags" >&2
  exit 1
fi
if [ "$mode" = asan-python ]; then
  if ! "$PYTHON" -c 'import pybind11' 2>/dev/null; then
    echo "sanitize.sh asan-python: $PYTHON has no pybind11 (pip install -e '.[test]' installs it)" >&2
    exit 1
  fi
  mapfile -t pyinc < <("$PYTHON" -c 'import sysconfig, pybind11; print(sysconfig.get_paths()["include"]); print(pybind11.get_include())')
  # bindings.cc (and the digest unit) only: the Python and pybind11 headers; the other objects are asan's.
  pyflags=(-I"${pyinc[0]}" -I"${pyinc[1]}")
  # The sources' digest, as setup.py records it (_native.SOURCE_DIGEST, in a generated translation unit
  # bindings.cc links against): benchmarks/tools.native_build() then judges this build by content like any
  # other, instead of calling it stale for want of one.
  "$PYTHON" -c 'import runpy, sys; m = runpy.run_path("lmcache_adp/source_digest.py")
open(sys.argv[1], "w").write(m["digest_unit"](m["source_digest"](".")))' "$out/adp_source_digest.cc.$$"
  mv "$out/adp_source_digest.cc.$$" "$out/adp_source_digest.cc"
  own=(src_cpp/python/bindings.cc "$out/adp_source_digest.cc")
  mapfile -t sources < <(find src_cpp -name '*.cc' ! -path src_cpp/python/bindings.cc | sort)
else
  own=()
  mapfile -t sources < <(find src_cpp -name '*.cc' ! -path src_cpp/python/bindings.cc | sort)
  sources+=(tests/cpp/connector_stress.cc)
fi
# --flags: where the objects shared with the test suite go and their compile flags, one a line, as compiled below
# (tests/sanitizers/test_sanitize_flags.py compares them with tests/support/cpp.py's).
if [ "${2:-}" = --flags ]; then
  printf '%s\n' "$objdir" "${flags[@]}"
  exit 0
fi

start=$SECONDS
# One build at a time per object directory: asan-python takes asan's lock, whose objects it links.
exec 9>"$objdir/build.lock"
flock 9
# One compiler per core (ADP_BUILD_JOBS), the objects not up to date only.
compile() { ADP_BUILD_JOBS=${ADP_BUILD_JOBS:-$(nproc)} "$PYTHON" scripts/object_stamps.py "$@" || echo FAILED; }
mapfile -t objs < <(compile "$objdir" "$CXX" "${flags[@]}" -- "${sources[@]}")
more=()
if [ "${#own[@]}" -gt 0 ]; then
  mapfile -t more < <(compile "$out" "$CXX" "${flags[@]}" "${pyflags[@]}" -- "${own[@]}")
fi
if [ "${#objs[@]}" -ne "${#sources[@]}" ] || [ "${#more[@]}" -ne "${#own[@]}" ]; then
  echo "sanitize.sh: the $mode build failed" >&2
  exit 1
fi
objs+=("${more[@]}")
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
