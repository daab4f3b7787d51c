// SPDX-License-Identifier: Apache-2.0
// Checks for the C++ test programs of tests/cpp (built and run by
// tests/support/cpp.py): a failed check is counted and reported, and the
// program goes on, so one run shows every check that failed. A program ends
// with "<name>: PASS" (exit 0) only when none did.
#pragma once

#include <cstdio>
#include <string>

namespace adp::testing {

inline int check_failures = 0;

// check(ok, what): counts and reports a failed check.
inline void check(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("CHECK FAILED: %s\n", what.c_str());
    check_failures++;
  }
}

}  // namespace adp::testing

// CHECK(cond, printf format, args...): the same, with the file and line.
#define CHECK(cond, ...)                                        \
  do {                                                          \
    if (!(cond)) {                                              \
      adp::testing::check_failures++;                           \
      std::fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                        \
      std::fprintf(stderr, "\n");                               \
    }                                                           \
  } while (0)
