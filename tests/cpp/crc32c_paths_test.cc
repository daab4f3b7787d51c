// SPDX-License-Identifier: Apache-2.0
// Every CRC32C implementation this CPU runs (src_cpp/util/crc32c.cc: the AVX-512 and 256-bit VPCLMULQDQ folding,
// the 128-bit PCLMULQDQ folding, the CRC32 instruction's three streams), forced by name (crc32c_extend_by), against
// the bitwise one: every length 0..kMaxSweep at every source misalignment 0..63, each with an initial CRC, as
// crc32c_extend and as crc32c_copy_extend (the destination at another misalignment: its bytes, and the bytes
// around it untouched); large sizes; pieces by two implementations joined by crc32c_combine and by extending.
// Each buffer is a heap block of exactly what the call may touch, so under ASan (tests/sanitizers) a read or
// write past either end fails. Only the CPU's own choice ran in a test before (tests/util/test_crc32c.py).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "check.h"
#include "util/crc32c.h"

using adp::testing::check;
using adp::testing::pattern;

namespace {

constexpr size_t kMaxSweep = 5000;

// A failed check of the sweeps: the first 40 shown, the others counted (a broken path fails ~10^5 of them).
void bad(const std::string& what) {
  static int shown = 0;
  if (++shown <= 40)
    check(false, what);
  else
    adp::testing::check_failures++;
}

struct Block {  // n bytes at a 64-byte aligned address: nothing else in the heap block
  explicit Block(size_t n) : p(static_cast<uint8_t*>(::operator new[](n ? n : 1, std::align_val_t(64)))) {}
  ~Block() { ::operator delete[](p, std::align_val_t(64)); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  uint8_t* p;
};

uint32_t by(const std::string& impl, uint32_t crc, void* dst, const void* src, size_t n) {
  std::optional<uint32_t> r = adp::crc32c_extend_by(impl, crc, dst, src, n);
  if (!r) {
    check(false, impl + ": not run by this CPU, though listed");
    return 0;
  }
  return *r;
}

std::string where(const std::string& impl, const char* what, size_t n, size_t m, size_t dm = 0) {
  return impl + " " + what + " n=" + std::to_string(n) + " misalign=" + std::to_string(m) +
         " dst_misalign=" + std::to_string(dm);
}

// One call as crc32c_extend and one as crc32c_copy_extend of src[0..n) (at misalignment m of a block of m+n
// bytes), against `ref`; the copy's destination at misalignment dm with 16 guard bytes after it.
void check_one(const std::string& impl, const uint8_t* data, size_t n, size_t m, uint32_t init, uint32_t ref) {
  Block src(m + n);
  std::memcpy(src.p + m, data, n);
  uint32_t got = by(impl, init, nullptr, src.p + m, n);
  if (got != ref) bad(where(impl, "extend", n, m));
  size_t dm = (m * 37 + n) % 64;
  Block dst(dm + n + 16);
  std::memset(dst.p, 0xA5, dm + n + 16);
  got = by(impl, init, dst.p + dm, src.p + m, n);
  if (got != ref) bad(where(impl, "copy", n, m, dm));
  if (std::memcmp(dst.p + dm, data, n) != 0) bad(where(impl, "copy's bytes", n, m, dm));
  for (size_t i = 0; i < dm; i++)
    if (dst.p[i] != 0xA5) {
      bad(where(impl, "copy wrote before dst", n, m, dm));
      break;
    }
  for (size_t i = dm + n; i < dm + n + 16; i++)
    if (dst.p[i] != 0xA5) {
      bad(where(impl, "copy wrote past dst", n, m, dm));
      break;
    }
}

}  // namespace

int main() {
  std::vector<std::string> impls;
  for (const char* name : adp::crc32c_implementations()) impls.emplace_back(name);
  std::printf("implementations:");
  for (auto& i : impls) std::printf(" %s", i.c_str());
  std::printf(" (best: %s)\n", adp::crc32c_implementation());
  check(!impls.empty() && impls[0] == adp::crc32c_implementation(), "the first listed is the CPU's choice");
  check(!impls.empty() && impls.back() == "bitwise", "bitwise is listed last");
  check(!adp::crc32c_extend_by("no-such-crc", 0, nullptr, "x", 1), "an unknown name is refused");
  const char* kAll[] = {"vpclmulqdq", "vpclmulqdq-avx2", "pclmul", "sse4.2", "armv8", "bitwise"};
  for (const char* name : kAll) {
    bool listed = false;
    for (auto& i : impls) listed |= i == name;
    check(listed == adp::crc32c_extend_by(name, 0, nullptr, "x", 1).has_value(),
          std::string(name) + ": runs by name exactly when listed");
  }
  check(by("bitwise", 0, nullptr, "123456789", 9) == 0xE3069283u, "bitwise: the check value");

  // Every length at every misalignment; the reference for a misalignment's lengths one byte at a time.
  const std::vector<uint8_t> data = pattern(kMaxSweep + 64, 7);
  const uint32_t inits[] = {0, 0xFFFFFFFFu, 0x12345678u, 0x9E3779B9u};
  for (size_t m = 0; m < 64; m++) {
    const uint8_t* d = data.data() + m;  // other bytes at each misalignment
    uint32_t init = inits[m % 4], ref = init;
    for (size_t n = 0; n <= kMaxSweep; n++) {
      if (n) ref = by("bitwise", ref, nullptr, d + n - 1, 1);
      for (auto& impl : impls)
        if (impl != "bitwise") check_one(impl, d, n, m, init, ref);
    }
  }

  // Large sizes (the folding loops' many rounds, the 3-way loop's 12 KiB rounds), with and without an initial CRC.
  for (size_t n : {size_t(1 << 20) + 77, size_t(32 << 20) + 5}) {
    const std::vector<uint8_t> big = pattern(n, static_cast<uint8_t>(n));
    for (uint32_t init : {0u, 0x9E3779B9u}) {
      uint32_t ref = by("bitwise", init, nullptr, big.data(), n);
      for (auto& impl : impls)
        if (impl != "bitwise")
          for (size_t m : {0, 3, 33}) check_one(impl, big.data(), n, m, init, ref);
    }
  }

  // Pieces by two implementations, joined by crc32c_combine and by extending one with the other.
  const std::vector<uint8_t> msg = pattern(70000, 9);
  const uint32_t whole = by("bitwise", 0, nullptr, msg.data(), msg.size());
  for (auto& a : impls)
    for (auto& b : impls)
      for (size_t k : {0, 1, 511, 512, 4096 + 13, 65536}) {
        size_t rest = msg.size() - k;
        uint32_t crc_a = by(a, 0, nullptr, msg.data(), k), crc_b = by(b, 0, nullptr, msg.data() + k, rest);
        if (adp::crc32c_combine(crc_a, crc_b, rest) != whole)
          bad("combine " + a + " + " + b + " at " + std::to_string(k));
        if (by(b, crc_a, nullptr, msg.data() + k, rest) != whole)
          bad("extend " + a + " by " + b + " at " + std::to_string(k));
      }

  // The public entry points are the CPU's choice.
  std::vector<uint8_t> out(msg.size());
  check(adp::crc32c(msg.data(), msg.size()) == whole, "crc32c");
  check(adp::crc32c_copy(out.data(), msg.data(), msg.size()) == whole && out == msg, "crc32c_copy");
  check(
      adp::crc32c_copy_extend(adp::crc32c(msg.data(), 1000), out.data(), msg.data() + 1000, msg.size() - 1000) == whole,
      "crc32c_copy_extend");
  return adp::testing::finish("crc32c_paths_test");
}
