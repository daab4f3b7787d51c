#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# usage: mk.sh NAME...  (from the worktree root) plain build as tests/support/cpp.py, objects kept in /tmp/ct28/obj
set -e
SRC=$PWD/src_cpp
FLAGS=(-std=c++20 -O1 -g -D_GLIBCXX_ASSERTIONS -Wall -Wextra -Werror -Wno-missing-field-initializers -I$SRC -pthread)
for name in "$@"; do
  srcs=$(ls src_cpp/store/*.cc src_cpp/util/*.cc src_cpp/testing/*.cc | sort; echo tests/cpp/$name.cc)
  objs=$(ADP_BUILD_JOBS=2 python scripts/object_stamps.py /tmp/ct28/obj g++ "${FLAGS[@]}" -- $srcs)
  mkdir -p ${OUT:-/tmp/ct28/bin}/$name
  g++ "${FLAGS[@]}" $objs -o ${OUT:-/tmp/ct28/bin}/$name/$name
  echo built $name
done
