// SPDX-License-Identifier: Apache-2.0
// The CRC32C dispatch's CPU gate (src_cpp/util/crc32c.cc: kImpls and the cpu_has_* checks) on CPUs this machine is
// not: crc32c.cc is built into this program with __builtin_cpu_supports replaced by a fake feature set, so each
// case below is a CPU (an AVX-512 one, one with AVX2 and VPCLMULQDQ, one whose hypervisor masks AVX2 but not
// VPCLMULQDQ, PCLMULQDQ alone, ...). crc32c_implementations() asks the gate afresh each call (the CPU's choice,
// best_impl(), is the first it lists, made once), and crc32c_extend_by must refuse a name the fake CPU lacks
// before running anything. tests/cpp/crc32c_paths_test.cc checks the implementations' results on the real CPU.
//
// The OS half of the gate is libgcc's: __builtin_cpu_supports("avx2") and ("vpclmulqdq") are set only where
// OSXSAVE is on and XCR0 enables the SSE and YMM state (gcc's common/config/i386/cpuinfo.h, avx_usable), AVX-512
// only where XCR0 enables the opmask and ZMM state too. Checked below against CPUID and XGETBV on this machine.
#include <cpuid.h>

#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "check.h"

namespace {

// This machine's real answer, before the fake replaces the builtin below.
bool real_supports_avx2() { return __builtin_cpu_supports("avx2"); }
bool real_supports_vpclmulqdq() { return __builtin_cpu_supports("vpclmulqdq"); }
bool real_supports_avx512f() { return __builtin_cpu_supports("avx512f"); }

uint64_t xcr0() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

std::set<std::string> g_features;  // the fake CPU's
bool fake_supports(const char* feature) { return g_features.count(feature) != 0; }

}  // namespace

#define __builtin_cpu_supports(feature) fake_supports(feature)
#include "util/crc32c.cc"  // NOLINT: its kImpls and cpu_has_* checks, asked through the fake
#undef __builtin_cpu_supports

using adp::testing::check;

namespace {

std::string listed() {
  std::string s;
  for (const char* name : adp::crc32c_implementations()) s += std::string(s.empty() ? "" : " ") + name;
  return s;
}

// The fake CPU with `features`: the implementations it lists, best first, and a refusal of every other name.
void expect(const char* cpu, std::set<std::string> features, const std::string& want) {
  g_features = std::move(features);
  std::string got = listed();
  check(got == want, std::string(cpu) + ": lists \"" + got + "\", want \"" + want + "\"");
  for (const char* name : {"vpclmulqdq", "vpclmulqdq-avx2", "pclmul", "sse4.2"}) {
    if ((" " + want + " ").find(std::string(" ") + name + " ") != std::string::npos) continue;
    check(!adp::crc32c_extend_by(name, 0, nullptr, "x", 1).has_value(),
          std::string(cpu) + ": forcing " + name + " is refused");
  }
}

}  // namespace

int main() {
  // The names stand for the code they run (raw_by): the AVX-512 name for fold_raw, the AVX2 one for fold256_raw.
  const std::pair<const char*, adp::Impl> kNames[] = {{"vpclmulqdq", adp::Impl::kFold512},
                                                      {"vpclmulqdq-avx2", adp::Impl::kFold256},
                                                      {"pclmul", adp::Impl::kPclmul},
                                                      {"sse4.2", adp::Impl::kHw},
                                                      {"bitwise", adp::Impl::kBitwise}};
  for (const auto& [name, impl] : kNames) {
    int found = 0;
    for (const adp::ImplEntry& e : adp::kImpls)
      if (std::string(e.name) == name) found += e.impl == impl ? 1 : 100;
    check(found == 1, std::string(name) + ": one entry, its own code");
  }

  // The fold constants for every distance the folding paths fold by (pclmul_raw: 128..512 bits, fold256_raw:
  // 256 * 1..4, fold_raw: 512..2048), as derived apart from the code: x^(D+63) and x^(D-1) mod P by plain
  // carry-less arithmetic on P = 0x11EDC6F41, each bit-reflected into 32 bits and shifted left 32 (low qword,
  // high qword; benchmarks/results/raw/2026-12-07-review38c/fold_constants.py).
  const struct {
    uint64_t bits, lo, hi;
  } kConstants[] = {{128, 0x3743f7bd00000000, 0x3171d43000000000},  {256, 0x33ccbbbc00000000, 0xa2158b3400000000},
                    {384, 0xa46ef4aa00000000, 0x6051243f00000000},  {512, 0x1c19243b00000000, 0x75bba45b00000000},
                    {768, 0xc92f998d00000000, 0x3365346a00000000},  {1024, 0x6577b24500000000, 0x7417153f00000000},
                    {1536, 0x7ccbbbf200000000, 0x31c9460800000000}, {2048, 0xe9a5d8be00000000, 0x1426a81500000000}};
  for (const auto& k : kConstants) {
    const __m128i got = adp::fold_constants(k.bits);
    check(static_cast<uint64_t>(_mm_cvtsi128_si64(got)) == k.lo &&
              static_cast<uint64_t>(_mm_cvtsi128_si64(_mm_unpackhi_epi64(got, got))) == k.hi,
          "fold constants for " + std::to_string(k.bits) + " bits");
  }

  const std::set<std::string> kAvx512 = {"avx512f",    "avx512vl", "avx512bw", "avx2",  // Ice Lake, Zen 4
                                         "vpclmulqdq", "pclmul",   "sse4.2"};
  expect("AVX-512 with VPCLMULQDQ", kAvx512, "vpclmulqdq vpclmulqdq-avx2 pclmul sse4.2 bitwise");
  std::set<std::string> no_bw = kAvx512;
  no_bw.erase("avx512bw");
  expect("AVX-512 without AVX512BW", no_bw, "vpclmulqdq-avx2 pclmul sse4.2 bitwise");
  expect("AVX2 and VPCLMULQDQ, no AVX-512 (Zen 3, this VM)", {"avx2", "vpclmulqdq", "pclmul", "sse4.2"},
         "vpclmulqdq-avx2 pclmul sse4.2 bitwise");
  expect("VPCLMULQDQ with AVX2 masked (a hypervisor)", {"vpclmulqdq", "pclmul", "sse4.2"}, "pclmul sse4.2 bitwise");
  expect("AVX-512 and VPCLMULQDQ with AVX2 masked",
         {"avx512f", "avx512vl", "avx512bw", "vpclmulqdq", "pclmul", "sse4.2"}, "vpclmulqdq pclmul sse4.2 bitwise");
  expect("AVX2 without VPCLMULQDQ (Haswell, Zen 2)", {"avx2", "pclmul", "sse4.2"}, "pclmul sse4.2 bitwise");
  expect("VPCLMULQDQ and AVX2 without PCLMULQDQ", {"avx2", "vpclmulqdq", "sse4.2"}, "sse4.2 bitwise");
  expect("PCLMULQDQ without SSE4.2", {"avx2", "vpclmulqdq", "pclmul"}, "bitwise");
  expect("SSE4.2 alone", {"sse4.2"}, "sse4.2 bitwise");
  expect("none", {}, "bitwise");

  // The OS half, on this machine: libgcc reports AVX2, VPCLMULQDQ and AVX-512F only with their state enabled.
  const uint64_t x = xcr0();
  std::printf("XCR0 %#llx, avx2 %d, vpclmulqdq %d, avx512f %d\n", static_cast<unsigned long long>(x),
              real_supports_avx2(), real_supports_vpclmulqdq(), real_supports_avx512f());
  check(!real_supports_avx2() || (x & 6) == 6, "avx2 reported only with XCR0's SSE and YMM state enabled");
  check(!real_supports_vpclmulqdq() || (x & 6) == 6, "vpclmulqdq reported only with XCR0's SSE and YMM state enabled");
  check(!real_supports_avx512f() || (x & 0xE6) == 0xE6, "avx512f reported only with XCR0's ZMM state enabled");
  return adp::testing::finish("crc32c_gate_test");
}
