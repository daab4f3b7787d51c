#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the C++ core (src_cpp without the Python bindings) and the stress
# test tests/cpp/connector_stress.cc under a sanitizer, then runs the test.
# Any sanitizer report or failed check makes the exit code non-zero.
#
#   scripts/sanitize.sh asan|tsan [card_dir]
#
# asan = AddressSanitizer + UndefinedBehaviorSanitizer, tsan = ThreadSanitizer.
# ADP_STRESS_SCALE=N multiplies the stress test's work (default 1), for soak runs.
# card_dir holds the test's card image (a 48 MiB file, removed afterwards) and
# must support O_DIRECT; default /dev/shm (tmpfs has O_DIRECT since Linux 6.6),
# else build/sanitize. Objects and the binary go to build/sanitize/<mode>/.
# Every file is written under a temporary name and renamed, so concurrent runs
# in one tree do not read each other's half-written objects.
set -euo pipefail

mode=${1:-}
case "$mode" in
  asan) san=(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer) ;;
  tsan) san=(-fsanitize=thread) ;;
  *)
    echo "usage: $0 asan|tsan [card_dir]" >&2
    exit 2
    ;;
esac

cd "$(dirname "$0")/.."
out=build/sanitize/$mode
mkdir -p "$out"
card_dir=${2:-/dev/shm}
[ -n "${2:-}" ] || [ -w /dev/shm ] || card_dir=$out
CXX=${CXX:-g++}
flags=(-std=c++20 -g -O1 "${san[@]}" -Wall -Wextra -Werror -Wno-missing-field-initializers -Isrc_cpp -pthread)
mapfile -t sources < <(find src_cpp -name '*.cc' ! -path src_cpp/python/bindings.cc | sort)
sources+=(tests/cpp/connector_stress.cc)

start=$SECONDS
# One compiler per core: the build is most of the time on a small machine.
printf '%s\n' "${sources[@]}" |
  CXX=$CXX FLAGS="${flags[*]}" OUT=$out xargs -P "$(nproc)" -n 1 \
    sh -c 'o=$OUT/$(echo "${1%.cc}" | tr / _).o; $CXX $FLAGS -c "$1" -o "$o.$$" && mv "$o.$$" "$o"' sh
objs=()
for src in "${sources[@]}"; do
  obj=${src%.cc}
  objs+=("$out/${obj//\//_}.o")
done
"$CXX" "${flags[@]}" "${objs[@]}" -o "$out/connector_stress.$$"
mv "$out/connector_stress.$$" "$out/connector_stress"
echo "sanitize.sh: built $out/connector_stress ($mode) in $((SECONDS - start)) s"

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
"${run[@]}" "$out/connector_stress" "$card" "${ADP_STRESS_SCALE:-1}" || status=$?
echo "sanitize.sh: $mode run exited $status in $((SECONDS - start)) s"
exit "$status"
