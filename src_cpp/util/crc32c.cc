// SPDX-License-Identifier: Apache-2.0
#include "util/crc32c.h"

#include <cstring>

#if defined(__x86_64__)
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

// x^(8n) mod P: the operator that appends n zero bytes to a raw CRC register.
uint32_t x_pow_8n(uint64_t n) {
  uint32_t result = 1u << 31;  // x^0
  uint32_t base = 1u << 23;    // x^8
  while (n) {
    if (n & 1) result = mult_mod_p(base, result);
    base = mult_mod_p(base, base);
    n >>= 1;
  }
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

}  // namespace

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
#ifdef ADP_HAVE_HW
  static const bool hw = cpu_has_hw();
  if (hw) return ~hw_raw<false>(~crc, p, nullptr, n);
#endif
  return ~bitwise_raw(~crc, p, n);
}

uint32_t crc32c_copy(void* dst, const void* src, size_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
#ifdef ADP_HAVE_HW
  static const bool hw = cpu_has_hw();
  if (hw) return ~hw_raw<true>(~0u, p, static_cast<uint8_t*>(dst), n);
#endif
  std::memcpy(dst, src, n);
  return ~bitwise_raw(~0u, p, n);
}

const char* crc32c_implementation() {
#ifdef ADP_HAVE_HW
  if (cpu_has_hw()) return kHwName;
#endif
  return "bitwise";
}

}  // namespace adp
