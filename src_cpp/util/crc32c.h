// SPDX-License-Identifier: Apache-2.0
// CRC32C (Castagnoli) checksums for the card store.
//
// Folds with carry-less multiplies where the CPU has them (VPCLMULQDQ on
// 512-bit or 256-bit registers, PCLMULQDQ), else uses the CPU's CRC32C
// instruction (SSE4.2 on x86-64, ARMv8 CRC on aarch64) over three interleaved
// streams, joined with the GF(2) shift operator so the
// result equals the plain byte-serial CRC. A bitwise fallback keeps other CPUs
// correct (slowly). Thread-safe: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

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
// or more ("vpclmulqdq" (AVX-512), "vpclmulqdq-avx2" (256-bit, AVX2 without
// AVX-512), "pclmul", "sse4.2", "armv8", "bitwise").
const char* crc32c_implementation();

// Tests and benchmarks only: every implementation this CPU can run, best first
// (the first is crc32c_implementation()).
std::vector<const char*> crc32c_implementations();
// Tests and benchmarks only: crc32c_copy_extend (dst not null) or
// crc32c_extend (dst null) by the named implementation instead of the best
// (a folding one from 512 bytes, as crc32c_implementation(); the CRC32
// instruction below); nullopt for a name this CPU cannot run.
std::optional<uint32_t> crc32c_extend_by(std::string_view implementation, uint32_t crc, void* dst, const void* src,
                                         size_t n);

}  // namespace adp
