// SPDX-License-Identifier: Apache-2.0
// On-card format, version 4. The prose spec is docs/card_format.md; keep the
// two in step and bump kFormatVersion on any incompatible change.
//
//   offset 0                  Superblock (one 4 KiB block)
//   kBackupSuperblockOffset   its backup copy (the block before kDataOffset;
//                             session 39: zeros on a card of an older build)
//   kDataOffset               region 0 | region 1 | ... | region N-1
//   region                    RegionHeader block, the continuation of an
//                             object begun in the previous region (if any),
//                             then records back to back
//   record                    ObjectHeader block (header + key), then the
//                             payload, padded to a multiple of 4 KiB; the
//                             last record of a region may continue into the
//                             next region the write frontier opened
//
// All integers little-endian. Every record carries a CRC32C of its own bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "common/store_types.h"

namespace adp {

constexpr uint32_t kFormatVersion = 4;
// The oldest format this build opens (docs/card_format.md, Versions): a
// version-3 card is read as written (its tombstones keep no key) and written
// on as version 4 writes, its superblock left at 3.
constexpr uint32_t kOldestFormatVersion = 3;
constexpr uint64_t kBlockSize = 4096;       // unit of every on-card I/O
constexpr uint64_t kDataOffset = 1u << 20;  // regions start at 1 MiB
// The backup superblock (session 39, docs/card_format.md "The backup
// superblock"): block 0's 4 KiB again, in the last block of the unused area
// before region 0, far from block 0 (a device that loses a page or an erase
// unit loses its neighbours with it). A format writes and syncs it first.
constexpr uint64_t kBackupSuperblockOffset = kDataOffset - kBlockSize;
constexpr uint64_t kMinRegionBytes = 1u << 20;  // 1 MiB
// The largest region (objects span regions, so this bounds no object).
constexpr uint64_t kMaxRegionBytes = kMaxObjectBytes + kMaxObjectBytes / 64 + kBlockSize;
constexpr uint32_t kNoRegion = UINT32_MAX;
// Recovery, a region header it could not walk (docs/card_format.md, "A region
// header not walked"): the next epoch is set this far past the highest seen,
// and, where the records behind that header could neither be hidden nor read
// (CardStore::hide_behind), the next seq (or by the card's blocks if more).
// An index entry holds a seq in 46 bits: 2^14 such opens before a seq
// outgrows it (then stores are refused: reserve; stat store_seqs_left).
constexpr uint64_t kUnseenEpochMargin = uint64_t(1) << 32;
constexpr uint64_t kUnseenSeqMargin = uint64_t(1) << 32;
constexpr uint32_t kMinRegions = 8;

constexpr char kSuperMagic[8] = {'A', 'D', 'P', 'C', 'A', 'R', 'D', '1'};
constexpr char kRegionMagic[8] = {'A', 'D', 'P', 'R', 'E', 'G', 'N', '1'};
constexpr char kObjectMagic[8] = {'A', 'D', 'P', 'O', 'B', 'J', 'T', '1'};

// Block 0 of the card, and its backup at kBackupSuperblockOffset (the same
// 4 KiB). Written by `format` (the backup first); afterwards only an open
// that found one copy bad rewrites it from the other.
struct Superblock {
  char magic[8];
  uint32_t format_version;
  uint32_t block_size;
  uint64_t card_bytes;  // bytes of the device/image the layout was made for
  uint64_t region_bytes;
  uint32_t num_regions;
  uint32_t max_key_bytes;
  uint64_t data_offset;
  uint64_t card_id;  // random per format: records of an older format never match
  uint64_t created_unix;
  uint32_t reserved;
  uint32_t crc;  // CRC32C of all bytes before this field
};

// First block of a region. A new epoch is written each time the region is
// (re)opened for appending; objects carry the epoch they were written under,
// so leftovers of an earlier use of the region are recognised and ignored.
// The write frontier moves from region to region: `prev_region` and
// `prev_epoch` name the region it left (kNoRegion if none), and the first
// `cont_bytes` after this block continue the last record of that region (so
// the first record of this region starts at kBlockSize + cont_bytes; a
// region that is all continuation has cont_bytes = region_bytes - kBlockSize).
struct RegionHeader {
  char magic[8];
  uint64_t card_id;
  uint64_t epoch;
  uint32_t region_index;
  uint32_t prev_region;
  uint64_t prev_epoch;
  uint64_t cont_bytes;
  uint32_t reserved;
  uint32_t crc;  // CRC32C of all bytes before this field
};

enum ObjectFlags : uint32_t {
  kObjectDeleted = 1,    // deleted or superseded; kept so the chain can be walked
  kObjectContinues = 2,  // the record runs past its region's end into the next region(s)
  // An abandoned reservation, or a crash's cut padded at open: no object, only its length (a hole to step over).
  kObjectPad = 4,
};

// First block of an object; the key follows the struct in the same block.
struct ObjectHeader {
  char magic[8];
  uint64_t card_id;
  uint64_t epoch;  // epoch of the region when written
  uint64_t seq;    // card-wide store sequence: the newest copy of a key wins
  uint64_t key_hash;
  uint64_t payload_bytes;
  uint32_t flags;
  uint32_t key_bytes;
  uint32_t payload_crc;  // CRC32C of the payload
  uint32_t header_crc;   // CRC32C of this struct up to here, then of the key
};

static_assert(sizeof(Superblock) == 72, "superblock layout");
static_assert(sizeof(RegionHeader) == 56, "region header layout");
static_assert(sizeof(ObjectHeader) == 64, "object header layout");
static_assert(sizeof(ObjectHeader) + kMaxKeyBytes <= kBlockSize, "key must fit the header block");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "format is little-endian");

inline uint64_t round_up_block(uint64_t n) { return (n + kBlockSize - 1) & ~(kBlockSize - 1); }

// Bytes an object occupies in its region: header block + padded payload.
inline uint64_t object_footprint(uint64_t payload_bytes) { return kBlockSize + round_up_block(payload_bytes); }
// Whether a record of `payload_bytes` starting at `offset` in its region runs
// past the region's end (flag kObjectContinues): the one test, for the
// records written (objects, pads, tombstones) and those walked at recovery.
inline bool record_continues(uint64_t offset, uint64_t payload_bytes, uint64_t region_bytes) {
  return offset + object_footprint(payload_bytes) > region_bytes;
}

// MurmurHash64A (public seed) of a key: written in object headers and
// tombstones. The in-memory index is keyed by index_hash (store/index_hash.h).
uint64_t hash_key(std::string_view key);

// ---- Record encoding and decoding. Each record checks its own CRC.

uint32_t superblock_crc(const Superblock& sb);
// True if sb has the magic and its CRC checks out (any version).
bool valid_superblock(const Superblock& sb);
// Whether the n bytes at p are all zero.
bool all_zero(const void* p, size_t n);
// Whether a block 0 (kBlockSize bytes, not a valid superblock) is one of ours that a format did not finish writing
// (session 30): it begins with the magic (the write torn after it, the CRC then fails), or with a part of the magic
// and nothing but zeros after it (torn inside it, over a blank block 0). Anything else but zeros is foreign.
bool torn_superblock(const uint8_t* block);
// Whether a card whose block 0 (`block0_read`: its read succeeded; `block0` its kBlockSize bytes) is not a valid
// superblock opens with a valid backup superblock without the operator's word: block 0 unreadable, blank or torn
// (docs/card_format.md, "The backup superblock"). Readable bytes of another kind are refused by every open (fd39).
inline bool opens_with_backup(bool block0_read, const uint8_t* block0) {
  return !block0_read || all_zero(block0, kBlockSize) || torn_superblock(block0);
}

// Fills `block` (kBlockSize bytes) with the header of region `index` opened
// under `epoch`, continuing `cont_bytes` of region prev_region's last record.
void encode_region_header(uint8_t* block, uint64_t card_id, uint64_t epoch, uint32_t index, uint32_t prev_region,
                          uint64_t prev_epoch, uint64_t cont_bytes);
// Checks the header block of region `index` of card `card_id`.
bool decode_region_header(const uint8_t* block, uint64_t card_id, uint32_t index, RegionHeader* out);

// Fills `block` (kBlockSize bytes) with an object header and its key.
void encode_object_header(uint8_t* block, uint64_t card_id, uint64_t epoch, uint64_t seq, std::string_view key,
                          uint64_t payload_bytes, uint32_t payload_crc, uint32_t flags);
// Fills `block` with the tombstone of the object (key, seq) that was written
// under `epoch`: written over that object's header block, it keeps
// payload_bytes and kObjectContinues (so the chain can still be walked), the
// key's sequence number and (format 4) the key itself with its hash_key, so
// that recovery orders the delete against other copies of that key only. An
// empty key (the object's header could not be read: damaged) names no key
// (key_hash 0): it orders nothing. Format 3 builds wrote tombstones with the
// key's hash_key and no key; recovery still reads those as deleting every
// older copy of any key with that hash.
void encode_tombstone(uint8_t* block, uint64_t card_id, uint64_t epoch, uint64_t seq, std::string_view key,
                      uint64_t payload_bytes, bool continues);
// Fills `block` with a pad record: the reservation of `payload_bytes` at
// this place was abandoned (its write failed); recovery steps over it.
void encode_pad(uint8_t* block, uint64_t card_id, uint64_t epoch, uint64_t payload_bytes, bool continues);
// Checks the header block of an object written under (card_id, epoch).
bool decode_object_header(const uint8_t* block, uint64_t card_id, uint64_t epoch, ObjectHeader* out);
// The key stored in a header block decoded by decode_object_header.
inline std::string_view object_key(const uint8_t* block, const ObjectHeader& h) {
  return std::string_view(reinterpret_cast<const char*>(block) + sizeof h, h.key_bytes);
}

}  // namespace adp
