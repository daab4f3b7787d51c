#!/bin/bash
# Builds sync_overlap_test against main's sources (/work/main/src_cpp), the test from the worktree.
set -e
cd /tmp/b36red
SRC=/work/main/src_cpp
cp /work/wt-behind36/tests/cpp/sync_overlap_test.cc /tmp/b36red/t/ 2>/dev/null || { mkdir -p t; cp /work/wt-behind36/tests/cpp/sync_overlap_test.cc t/; }
cp /work/main/tests/cpp/*.h t/
FLAGS="-std=c++20 -O1 -g -D_GLIBCXX_ASSERTIONS -Wall -Wextra -Werror -Wno-missing-field-initializers -I$SRC -pthread"
srcs="$(ls $SRC/store/*.cc $SRC/util/*.cc $SRC/connector/*.cc $SRC/testing/*.cc) $SRC/transport/embedded_backend.cc t/sync_overlap_test.cc"
mkdir -p o
printf '%s\n' $srcs | xargs -P2 -I{} sh -c 'g++ '"$FLAGS"' -c {} -o o/$(echo {} | tr / _).o'
g++ $FLAGS o/*.o -o sync_overlap_test_main
