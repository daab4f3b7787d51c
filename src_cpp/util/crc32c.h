// SPDX-License-Identifier: Apache-2.0
// CRC32C (Castagnoli) checksums for the card store.
//
// Uses the CPU's CRC32C instruction (SSE4.2 on x86-64, ARMv8 CRC on aarch64)
// over three interleaved streams, joined with the GF(2) shift operator so the
// result equals the plain byte-serial CRC. A bitwise fallback keeps other CPUs
// correct (slowly). Thread-safe: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace adp {

// Extends `crc` (a finished CRC32C value, 0 for the empty message) with `n`
// bytes of `data`. crc32c_extend(0, "123456789", 9) == 0xE3069283.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);

inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

// Copies n bytes from src to dst and returns the CRC32C of them, in one pass
// over the memory (a load is checked while it is delivered).
uint32_t crc32c_copy(void* dst, const void* src, size_t n);
// The same, continuing the CRC `crc` of the bytes before (as crc32c_extend).
uint32_t crc32c_copy_extend(uint32_t crc, void* dst, const void* src, size_t n);

// The CRC32C of A followed by B, from crc_a (A's), crc_b (B's) and B's
// length: pieces of one message checked in any order, on any threads, and
// joined in order (one multiplication mod P a bit set in len_b, no pass
// over the bytes).
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// Which implementation crc32c_extend uses on this CPU for buffers of 512 bytes
// or more ("vpclmulqdq", "pclmul", "sse4.2", "armv8", "bitwise").
const char* crc32c_implementation();

}  // namespace adp
