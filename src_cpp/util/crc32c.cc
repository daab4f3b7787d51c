// SPDX-License-Identifier: Apache-2.0
#include "util/crc32c.h"

#include <array>
#include <cstring>
#include <iterator>

#if defined(__x86_64__)
#include <immintrin.h>
#include <nmmintrin.h>
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#endif

namespace adp {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // CRC32C, reflected.

// Product of a and b modulo the CRC polynomial, both in the reflected
// representation where bit 31 is x^0 (the approach of zlib's crc32_combine).
uint32_t mult_mod_p(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(8n) mod P: the operator that appends n zero bytes to a raw CRC register,
// as the product of x^(8 * 2^k) over the bits k of n, taken from a table
// made once: one multiplication a bit set (a 256 KiB piece: one), not two
// a bit of n's length (7.8-9 us of every 2 MiB process load's 8 joins on the
// 16-core machine: benchmarks/README.md, "Session eight: loads").
uint32_t x_pow_8n(uint64_t n) {
  static const auto powers = [] {
    std::array<uint32_t, 64> t{};
    uint32_t base = 1u << 23;  // x^8
    for (auto& v : t) {
      v = base;
      base = mult_mod_p(base, base);
    }
    return t;
  }();
  uint32_t result = 1u << 31;  // x^0
  for (int k = 0; n; k++, n >>= 1)
    if (n & 1) result = mult_mod_p(powers[k], result);
  return result;
}

uint32_t bitwise_raw(uint32_t crc, const uint8_t* p, size_t n) {
  while (n--) {
    crc ^= *p++;
    for (int k = 0; k < 8; k++) crc = (crc & 1) ? (crc >> 1) ^ kPoly : crc >> 1;
  }
  return crc;
}

// Bytes per stream in the three-way loop: large enough that the two shifts
// per round are noise, small enough that short buffers still use it.
constexpr size_t kStride = 4096;

#if defined(__x86_64__)
#define ADP_CRC_TARGET __attribute__((target("sse4.2")))
ADP_CRC_TARGET inline uint64_t hw_u64(uint64_t c, uint64_t v) { return _mm_crc32_u64(c, v); }
ADP_CRC_TARGET inline uint32_t hw_u8(uint32_t c, uint8_t v) { return _mm_crc32_u8(c, v); }
bool cpu_has_hw() { return __builtin_cpu_supports("sse4.2"); }
constexpr const char* kHwName = "sse4.2";
#define ADP_HAVE_HW 1
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#define ADP_CRC_TARGET
inline uint64_t hw_u64(uint64_t c, uint64_t v) { return __crc32cd(static_cast<uint32_t>(c), v); }
inline uint32_t hw_u8(uint32_t c, uint8_t v) { return __crc32cb(c, v); }
bool cpu_has_hw() { return true; }
constexpr const char* kHwName = "armv8";
#define ADP_HAVE_HW 1
#endif

#ifdef ADP_HAVE_HW
// The raw CRC register over p[0..n); with kCopy the bytes are also stored to d.
template <bool kCopy>
ADP_CRC_TARGET uint32_t hw_raw(uint32_t crc, const uint8_t* p, uint8_t* d, size_t n) {
  static const uint32_t shift1 = x_pow_8n(kStride);
  static const uint32_t shift2 = x_pow_8n(2 * kStride);
  while (n && (reinterpret_cast<uintptr_t>(p) & 7)) {
    if (kCopy) *d++ = *p;
    crc = hw_u8(crc, *p++);
    n--;
  }
  while (n >= 3 * kStride) {
    uint64_t a = crc, b = 0, c = 0;
    for (size_t i = 0; i < kStride; i += 8) {
      uint64_t va, vb, vc;
      std::memcpy(&va, p + i, 8);
      std::memcpy(&vb, p + kStride + i, 8);
      std::memcpy(&vc, p + 2 * kStride + i, 8);
      a = hw_u64(a, va);
      b = hw_u64(b, vb);
      c = hw_u64(c, vc);
      if (kCopy) {
        std::memcpy(d + i, &va, 8);
        std::memcpy(d + kStride + i, &vb, 8);
        std::memcpy(d + 2 * kStride + i, &vc, 8);
      }
    }
    crc = mult_mod_p(shift2, static_cast<uint32_t>(a)) ^ mult_mod_p(shift1, static_cast<uint32_t>(b)) ^
          static_cast<uint32_t>(c);
    p += 3 * kStride;
    if (kCopy) d += 3 * kStride;
    n -= 3 * kStride;
  }
  uint64_t c64 = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = hw_u64(c64, v);
    if (kCopy) {
      std::memcpy(d, &v, 8);
      d += 8;
    }
  }
  crc = static_cast<uint32_t>(c64);
  while (n--) {
    if (kCopy) *d++ = *p;
    crc = hw_u8(crc, *p++);
  }
  return crc;
}
#endif

#if defined(__x86_64__)
// Carry-less multiplication folding (Intel, "Fast CRC Computation for Generic
// Polynomials Using PCLMULQDQ"), 4 x 512 bits at a time with VPCLMULQDQ: the
// CRC32C instruction retires 8 bytes a cycle at best, this ~4x that.
//
// Reflected domain: bit 127-i of a 128-bit lane loaded from memory is the
// coefficient of x^i of that block. A lane A = H x^64 + L (H in the low
// qword) moved D bits further down the message is A x^D, congruent mod P to
// H * (x^(D+63) mod P) + L * (x^(D-1) mod P): a clmul of reflected operands
// multiplies by one extra x. The result (< 96 bits) is xored into the block
// D bits later. What is left at the end is one 128-bit block congruent to
// the whole prefix, so the CRC32C instruction over its 16 bytes (register 0)
// gives the prefix's register; an initial register is xored into the first
// 32 bits of the message instead.
#define ADP_FOLD_TARGET __attribute__((target("sse4.2,pclmul,avx512f,avx512vl,avx512bw,vpclmulqdq")))

// x^e mod P in the reflected 32-bit representation (bit 31 is x^0).
uint32_t x_pow(uint64_t e) {
  uint32_t result = 1u << 31, base = 1u << 30;  // x^0, x^1
  while (e) {
    if (e & 1) result = mult_mod_p(base, result);
    base = mult_mod_p(base, base);
    e >>= 1;
  }
  return result;
}

// The two fold constants for distance `bits`, as one 128-bit lane: low qword
// multiplies the lane's low qword (H), high qword its high qword (L).
__m128i fold_constants(uint64_t bits) {
  return _mm_set_epi64x(static_cast<long long>(uint64_t(x_pow(bits - 1)) << 32),
                        static_cast<long long>(uint64_t(x_pow(bits + 63)) << 32));
}

// The 128-bit steps, shared by every folding path: fold_raw (AVX-512) and
// fold256_raw (AVX2) end with them, pclmul_raw (below, PCLMULQDQ only: four lanes of 16 bytes, 64 bytes
// a step) is made of them. pclmul_raw is for CPUs without VPCLMULQDQ whose CRC32 instruction
// does not retire a word a cycle: on the 2-core VM's AMD EPYC (no AVX-512) a
// 2 MiB CRC took 0.206 ms this way against 0.355 ms with the three-way loop
// above (5.5 GiB/s), crc32c_copy 0.210 against 0.374 (fastest of 400, session
// 27: benchmarks/results/2026-12-05-2000-probe27-direct-read.md); eight lanes
// were no faster.
#define ADP_PCLMUL_TARGET __attribute__((target("sse4.2,pclmul")))

ADP_PCLMUL_TARGET inline __m128i fold128(__m128i a, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(a, k, 0x00), _mm_clmulepi64_si128(a, k, 0x11)), next);
}

bool cpu_has_pclmul() { return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.2"); }

template <bool kCopy>
ADP_PCLMUL_TARGET inline __m128i load128(const uint8_t* p, uint8_t* d, size_t at) {
  __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + at));
  if (kCopy) _mm_storeu_si128(reinterpret_cast<__m128i*>(d + at), v);
  return v;
}

// Folds the 16-byte blocks left from `at` into x (one lane congruent to
// p[0..at)), then the register over the lane and the last n % 16 bytes by
// the CRC32 instruction: the end of both folding paths.
template <bool kCopy>
ADP_PCLMUL_TARGET uint32_t fold_tail(__m128i x, const uint8_t* p, uint8_t* d, size_t at, size_t n) {
  static const __m128i k128 = fold_constants(128);
  for (; at + 16 <= n; at += 16) x = fold128(x, k128, load128<kCopy>(p, d, at));
  uint64_t c = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(x)));
  c = _mm_crc32_u64(c, static_cast<uint64_t>(_mm_extract_epi64(x, 1)));
  return hw_raw<kCopy>(static_cast<uint32_t>(c), p + at, d + (kCopy ? at : 0), n - at);
}

ADP_FOLD_TARGET inline __m512i fold512(__m512i a, __m512i k, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a, k, 0x00), _mm512_clmulepi64_epi128(a, k, 0x11), next,
                                   0x96);
}

constexpr size_t kFoldMin = 512;  // shorter buffers are not worth the set-up

bool cpu_has_fold() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("vpclmulqdq") &&
         __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.2");
}

template <bool kCopy>
ADP_FOLD_TARGET inline __m512i load512(const uint8_t* p, uint8_t* d, size_t at) {
  __m512i v = _mm512_loadu_si512(p + at);
  if (kCopy) _mm512_storeu_si512(d + at, v);
  return v;
}

// The raw register over p[0..n), n >= kFoldMin; with kCopy also stored to d.
template <bool kCopy>
ADP_FOLD_TARGET uint32_t fold_raw(uint32_t crc, const uint8_t* p, uint8_t* d, size_t n) {
  static const __m512i k2048 = _mm512_maskz_broadcast_i32x4(0xFFFF, fold_constants(2048));
  static const __m512i k1536 = _mm512_maskz_broadcast_i32x4(0xFFFF, fold_constants(1536));
  static const __m512i k1024 = _mm512_maskz_broadcast_i32x4(0xFFFF, fold_constants(1024));
  static const __m512i k512 = _mm512_maskz_broadcast_i32x4(0xFFFF, fold_constants(512));
  static const __m128i k384 = fold_constants(384), k256 = fold_constants(256), k128 = fold_constants(128);
  __m512i z0 =
      _mm512_xor_si512(load512<kCopy>(p, d, 0), _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(crc))));
  __m512i z1 = load512<kCopy>(p, d, 64), z2 = load512<kCopy>(p, d, 128), z3 = load512<kCopy>(p, d, 192);
  size_t at = 256;
  for (; at + 256 <= n; at += 256) {
    z0 = fold512(z0, k2048, load512<kCopy>(p, d, at));
    z1 = fold512(z1, k2048, load512<kCopy>(p, d, at + 64));
    z2 = fold512(z2, k2048, load512<kCopy>(p, d, at + 128));
    z3 = fold512(z3, k2048, load512<kCopy>(p, d, at + 192));
  }
  __m512i z = fold512(z0, k1536, fold512(z1, k1024, fold512(z2, k512, z3)));
  for (; at + 64 <= n; at += 64) z = fold512(z, k512, load512<kCopy>(p, d, at));
  __m128i x = fold128(
      _mm512_maskz_extracti32x4_epi32(0xF, z, 0), k384,
      fold128(_mm512_maskz_extracti32x4_epi32(0xF, z, 1), k256,
              fold128(_mm512_maskz_extracti32x4_epi32(0xF, z, 2), k128, _mm512_maskz_extracti32x4_epi32(0xF, z, 3))));
  return fold_tail<kCopy>(x, p, d, at, n);
}

// 256-bit VPCLMULQDQ folding for CPUs with AVX2 and VPCLMULQDQ but no AVX-512 (e.g. AMD Zen 3, the 2-core
// VM's EPYC): two 128-bit lanes a ymm register, kYmmLanes registers (32 * kYmmLanes bytes a step), then one
// register 32 bytes a step, then the 128-bit tail (fold_tail) as the others. VEX-encoded VPCLMULQDQ needs AVX2
// only, not AVX-512. On the VM (session 38, fastest of 200, A/B in one run, load 8-10): 2 MiB in 0.081 ms
// (24 GiB/s) against pclmul_raw's 0.162 and the three-way CRC32 loop's 0.093, crc32c_copy the same; a plain
// read pass takes 0.042 (benchmarks/results/2026-12-07-crc38-vpclmulqdq-avx2.md). 2, 4 and 8 registers
// measured the same there (VPCLMULQDQ's throughput the limit); 4 keep a CPU whose VPCLMULQDQ issues one a
// cycle with a latency of 4 busy (a lane's round: 2 multiplies then 2 xors in a row).
#define ADP_FOLD256_TARGET __attribute__((target("sse4.2,pclmul,avx2,vpclmulqdq")))

bool cpu_has_fold256() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("pclmul") &&
         __builtin_cpu_supports("sse4.2");
}

ADP_FOLD256_TARGET inline __m256i fold256(__m256i a, __m256i k, __m256i next) {
  return _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(a, k, 0x00), _mm256_clmulepi64_epi128(a, k, 0x11)),
                          next);
}

template <bool kCopy>
ADP_FOLD256_TARGET inline __m256i load256(const uint8_t* p, uint8_t* d, size_t at) {
  __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + at));
  if (kCopy) _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + at), v);
  return v;
}

#ifndef ADP_FOLD256_LANES  // the probe's other lane counts (benchmarks/results/raw/2026-12-07-crc38/crcprobe.cc)
#define ADP_FOLD256_LANES 4
#endif
constexpr int kYmmLanes = ADP_FOLD256_LANES;
static_assert(kYmmLanes >= 1 && 32 * kYmmLanes <= kFoldMin, "the first loads must fit any buffer fold256_raw gets");

// The raw register over p[0..n), n >= kFoldMin; with kCopy also stored to d.
template <bool kCopy>
ADP_FOLD256_TARGET uint32_t fold256_raw(uint32_t crc, const uint8_t* p, uint8_t* d, size_t n) {
  constexpr size_t kStep = 32 * kYmmLanes;
  struct Constants {
    __m128i k[kYmmLanes + 1];  // k[j]: the constants for 256 * j bits, j = 1..kYmmLanes
  };
  static const Constants c = [] {
    Constants t{};
    for (int j = 1; j <= kYmmLanes; j++) t.k[j] = fold_constants(256 * j);
    return t;
  }();
  __m256i k[kYmmLanes + 1];
#pragma GCC unroll 16
  for (int j = 1; j <= kYmmLanes; j++) k[j] = _mm256_broadcastsi128_si256(c.k[j]);
  static const __m128i k128 = fold_constants(128);
  __m256i y[kYmmLanes];
  y[0] = _mm256_xor_si256(load256<kCopy>(p, d, 0), _mm256_zextsi128_si256(_mm_cvtsi32_si128(static_cast<int>(crc))));
#pragma GCC unroll 16
  for (int j = 1; j < kYmmLanes; j++) y[j] = load256<kCopy>(p, d, 32 * j);
  size_t at = kStep;
  for (; at + kStep <= n; at += kStep) {
#pragma GCC unroll 16
    for (int j = 0; j < kYmmLanes; j++) y[j] = fold256(y[j], k[kYmmLanes], load256<kCopy>(p, d, at + 32 * j));
  }
  __m256i z = y[kYmmLanes - 1];
#pragma GCC unroll 16
  for (int j = kYmmLanes - 2; j >= 0; j--) z = fold256(y[j], k[kYmmLanes - 1 - j], z);
  for (; at + 32 <= n; at += 32) z = fold256(z, k[1], load256<kCopy>(p, d, at));
  __m128i x = fold128(_mm256_castsi256_si128(z), k128, _mm256_extracti128_si256(z, 1));
  return fold_tail<kCopy>(x, p, d, at, n);
}

// The raw register over p[0..n), n >= kFoldMin; with kCopy also stored to d.
template <bool kCopy>
ADP_PCLMUL_TARGET uint32_t pclmul_raw(uint32_t crc, const uint8_t* p, uint8_t* d, size_t n) {
  static const __m128i k512 = fold_constants(512), k384 = fold_constants(384), k256 = fold_constants(256),
                       k128 = fold_constants(128);
  __m128i x0 = _mm_xor_si128(load128<kCopy>(p, d, 0), _mm_cvtsi32_si128(static_cast<int>(crc)));
  __m128i x1 = load128<kCopy>(p, d, 16), x2 = load128<kCopy>(p, d, 32), x3 = load128<kCopy>(p, d, 48);
  size_t at = 64;
  for (; at + 64 <= n; at += 64) {
    x0 = fold128(x0, k512, load128<kCopy>(p, d, at));
    x1 = fold128(x1, k512, load128<kCopy>(p, d, at + 16));
    x2 = fold128(x2, k512, load128<kCopy>(p, d, at + 32));
    x3 = fold128(x3, k512, load128<kCopy>(p, d, at + 48));
  }
  __m128i x = fold128(x0, k384, fold128(x1, k256, fold128(x2, k128, x3)));
  return fold_tail<kCopy>(x, p, d, at, n);
}
#endif

enum class Impl { kFold512, kFold256, kPclmul, kHw, kBitwise };

bool always() { return true; }

struct ImplEntry {
  Impl impl;
  const char* name;
  bool (*supported)();
};

// Every implementation, best first: the first one a CPU supports is the one it runs. An AVX-512 CPU (which has
// AVX2 and the 256-bit VPCLMULQDQ too) keeps fold_raw; one with AVX2 and VPCLMULQDQ but no AVX-512 takes
// fold256_raw; one with PCLMULQDQ and no VPCLMULQDQ (or no AVX2) keeps pclmul_raw.
const ImplEntry kImpls[] = {
#if defined(__x86_64__)
    {Impl::kFold512, "vpclmulqdq", cpu_has_fold},
    {Impl::kFold256, "vpclmulqdq-avx2", cpu_has_fold256},
    {Impl::kPclmul, "pclmul", cpu_has_pclmul},
#endif
#ifdef ADP_HAVE_HW
    {Impl::kHw, kHwName, cpu_has_hw},
#endif
    {Impl::kBitwise, "bitwise", always},
};

const ImplEntry& best_impl() {
  static const ImplEntry* best = [] {
    for (const ImplEntry& e : kImpls)
      if (e.supported()) return &e;
    return &kImpls[std::size(kImpls) - 1];
  }();
  return *best;
}

// The raw register over p[0..n) by `impl` (the folding ones from kFoldMin bytes, the CRC32 instruction below).
template <bool kCopy>
uint32_t raw_by(Impl impl, uint32_t crc, const uint8_t* p, uint8_t* d, size_t n) {
#if defined(__x86_64__)
  if (n >= kFoldMin) {
    if (impl == Impl::kFold512) return fold_raw<kCopy>(crc, p, d, n);
    if (impl == Impl::kFold256) return fold256_raw<kCopy>(crc, p, d, n);
    if (impl == Impl::kPclmul) return pclmul_raw<kCopy>(crc, p, d, n);
  }
#endif
#ifdef ADP_HAVE_HW
  if (impl != Impl::kBitwise) return hw_raw<kCopy>(crc, p, d, n);
#endif
  if (kCopy) std::memcpy(d, p, n);
  return bitwise_raw(crc, p, n);
}

// The raw register over p[0..n) by the fastest way this CPU has.
template <bool kCopy>
uint32_t best_raw(uint32_t crc, const uint8_t* p, uint8_t* d, size_t n) {
  static const Impl impl = best_impl().impl;
  return raw_by<kCopy>(impl, crc, p, d, n);
}

}  // namespace

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) {
  return ~best_raw<false>(~crc, static_cast<const uint8_t*>(data), nullptr, n);
}

uint32_t crc32c_copy(void* dst, const void* src, size_t n) {
  return ~best_raw<true>(~0u, static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), n);
}

uint32_t crc32c_copy_extend(uint32_t crc, void* dst, const void* src, size_t n) {
  return ~best_raw<true>(~crc, static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), n);
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return mult_mod_p(x_pow_8n(len_b), crc_a) ^ crc_b;  // zlib's crc32_combine: A shifted past B's bytes
}

const char* crc32c_implementation() { return best_impl().name; }

std::vector<const char*> crc32c_implementations() {
  std::vector<const char*> names;
  for (const ImplEntry& e : kImpls)
    if (e.supported()) names.push_back(e.name);
  return names;
}

std::optional<uint32_t> crc32c_extend_by(std::string_view implementation, uint32_t crc, void* dst, const void* src,
                                         size_t n) {
  for (const ImplEntry& e : kImpls) {
    if (implementation != e.name) continue;
    if (!e.supported()) return std::nullopt;
    const auto* p = static_cast<const uint8_t*>(src);
    if (dst) return ~raw_by<true>(e.impl, ~crc, p, static_cast<uint8_t*>(dst), n);
    return ~raw_by<false>(e.impl, ~crc, p, nullptr, n);
  }
  return std::nullopt;
}

}  // namespace adp
