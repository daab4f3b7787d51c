// SPDX-License-Identifier: Apache-2.0
// Checks for the C++ test programs of tests/cpp (built and run by
// tests/support/cpp.py): a failed check is counted and reported, and the
// program goes on, so one run shows every check that failed. A program ends
// with "<name>: PASS" (exit 0) only when none did.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace adp::testing {

// n bytes of a pseudo-random pattern that differs with seed.
inline std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x = x * 1103515245u + 12345u;
    v[i] = static_cast<uint8_t>(x >> 16);
  }
  return v;
}

// The program's one argument, `name` in its usage line (DIR, CARD_IMAGE); false (the usage printed)
// when it was not given.
inline bool one_argument(int argc, char** argv, const char* name, std::string* value) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s %s\n", argv[0], name);
    return false;
  }
  *value = argv[1];
  return true;
}

inline int check_failures = 0;

// check(ok, what): counts and reports a failed check.
inline void check(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("CHECK FAILED: %s\n", what.c_str());
    check_failures++;
  }
}

// The program's end, its exit code: "<name>: PASS" and 0 when no check failed, else "<name>: N checks failed"
// and 1 (tests/support/cpp.py's run looks for the PASS line and the 0).
inline int finish(const char* name) {
  if (check_failures) {
    std::printf("%s: %d checks failed\n", name, check_failures);
    return 1;
  }
  std::printf("%s: PASS\n", name);
  return 0;
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
