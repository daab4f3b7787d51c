// SPDX-License-Identifier: Apache-2.0
// KeyTag: 16 bits of a key kept in its index entry beside the 64-bit
// hash_key, so that a load tells another key with the same hash from its
// own before it reads: the disk load reads header and payload in one
// request straight into the caller's buffer, and a miss must leave that
// buffer untouched. SipHash-2-4 under a key drawn at random once per
// process: hash_key (MurmurHash64A, public seed) collisions can be crafted,
// and MurmurHash has seed-independent ones; without the secret a crafted key
// matches the tag by chance only (1 in 65536). Never written to the card:
// computed at put, and at recovery from the key in the object's header.
#pragma once

#include <cstdint>
#include <string_view>

namespace adp {

uint16_t key_tag(std::string_view key);

}  // namespace adp
