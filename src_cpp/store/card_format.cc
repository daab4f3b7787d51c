// SPDX-License-Identifier: Apache-2.0
#include "store/card_format.h"

#include <algorithm>

#include "util/crc32c.h"

namespace adp {

// MurmurHash64A (Austin Appleby, public domain) over the key bytes. The
// hash is recomputed from the stored key at recovery, so the choice only has
// to be good, not frozen.
uint64_t hash_key(std::string_view key) {
  constexpr uint64_t m = 0xc6a4a7935bd1e995ULL;
  constexpr int r = 47;
  const uint64_t seed = 0x41445043415244ULL;  // "ADPCARD"
  uint64_t h = seed ^ (key.size() * m);
  const char* p = key.data();
  size_t n = key.size();
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t k;
    std::memcpy(&k, p, 8);
    k *= m;
    k ^= k >> r;
    k *= m;
    h ^= k;
    h *= m;
  }
  if (n) {
    uint64_t tail = 0;
    std::memcpy(&tail, p, n);
    h ^= tail;
    h *= m;
  }
  h ^= h >> r;
  h *= m;
  h ^= h >> r;
  return h;
}

uint32_t superblock_crc(const Superblock& sb) { return crc32c(&sb, offsetof(Superblock, crc)); }

bool valid_superblock(const Superblock& sb) {
  return std::memcmp(sb.magic, kSuperMagic, 8) == 0 && sb.crc == superblock_crc(sb);
}

bool all_zero(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::all_of(b, b + n, [](uint8_t c) { return c == 0; });
}

bool torn_superblock(const uint8_t* block) {
  if (std::memcmp(block, kSuperMagic, sizeof kSuperMagic) == 0) return true;
  size_t n = 0;
  while (n < sizeof kSuperMagic && block[n] == static_cast<uint8_t>(kSuperMagic[n])) n++;
  return n > 0 && all_zero(block + n, kBlockSize - n);
}

namespace {
uint32_t region_crc(const RegionHeader& h) { return crc32c(&h, offsetof(RegionHeader, crc)); }
uint32_t header_crc(const ObjectHeader& h, const void* key) {
  return crc32c_extend(crc32c(&h, offsetof(ObjectHeader, header_crc)), key, h.key_bytes);
}
}  // namespace

void encode_region_header(uint8_t* block, uint64_t card_id, uint64_t epoch, uint32_t index, uint32_t prev_region,
                          uint64_t prev_epoch, uint64_t cont_bytes) {
  std::memset(block, 0, kBlockSize);
  RegionHeader rh{};
  std::memcpy(rh.magic, kRegionMagic, 8);
  rh.card_id = card_id;
  rh.epoch = epoch;
  rh.region_index = index;
  rh.prev_region = prev_region;
  rh.prev_epoch = prev_epoch;
  rh.cont_bytes = cont_bytes;
  rh.crc = region_crc(rh);
  std::memcpy(block, &rh, sizeof rh);
}

bool decode_region_header(const uint8_t* block, uint64_t card_id, uint32_t index, RegionHeader* out) {
  std::memcpy(out, block, sizeof *out);
  return std::memcmp(out->magic, kRegionMagic, 8) == 0 && out->card_id == card_id && out->region_index == index &&
         out->crc == region_crc(*out);
}

void encode_object_header(uint8_t* block, uint64_t card_id, uint64_t epoch, uint64_t seq, std::string_view key,
                          uint64_t payload_bytes, uint32_t payload_crc, uint32_t flags) {
  std::memset(block, 0, kBlockSize);
  ObjectHeader h{};
  std::memcpy(h.magic, kObjectMagic, 8);
  h.card_id = card_id;
  h.epoch = epoch;
  h.seq = seq;
  h.key_hash = hash_key(key);
  h.payload_bytes = payload_bytes;
  h.flags = flags;
  h.key_bytes = static_cast<uint32_t>(key.size());
  h.payload_crc = payload_crc;
  if (!key.empty()) std::memcpy(block + sizeof h, key.data(), key.size());  // pads pass a null key
  h.header_crc = header_crc(h, block + sizeof h);
  std::memcpy(block, &h, sizeof h);
}

void encode_tombstone(uint8_t* block, uint64_t card_id, uint64_t epoch, uint64_t seq, std::string_view key,
                      uint64_t payload_bytes, bool continues) {
  // With a key: its hash_key as any header's. Without: key_hash 0, no key named.
  encode_object_header(block, card_id, epoch, seq, key, payload_bytes, 0,
                       kObjectDeleted | (continues ? uint32_t(kObjectContinues) : 0u));
  if (!key.empty()) return;
  ObjectHeader h;
  std::memcpy(&h, block, sizeof h);
  h.key_hash = 0;
  h.header_crc = header_crc(h, block + sizeof h);
  std::memcpy(block, &h, sizeof h);
}

void encode_pad(uint8_t* block, uint64_t card_id, uint64_t epoch, uint64_t payload_bytes, bool continues) {
  encode_tombstone(block, card_id, epoch, 0, std::string_view(), payload_bytes, continues);
  ObjectHeader h;
  std::memcpy(&h, block, sizeof h);
  h.flags = kObjectPad | (continues ? uint32_t(kObjectContinues) : 0u);
  h.header_crc = header_crc(h, block + sizeof h);
  std::memcpy(block, &h, sizeof h);
}

bool decode_object_header(const uint8_t* block, uint64_t card_id, uint64_t epoch, ObjectHeader* out) {
  std::memcpy(out, block, sizeof *out);
  return std::memcmp(out->magic, kObjectMagic, 8) == 0 && out->card_id == card_id && out->epoch == epoch &&
         out->key_bytes <= kMaxKeyBytes && out->header_crc == header_crc(*out, block + sizeof *out);
}

}  // namespace adp
