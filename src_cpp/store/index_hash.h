// SPDX-License-Identifier: Apache-2.0
// index_hash: the key of the card's in-memory index (store/key_index.h), a
// 64-bit SipHash-2-4 of the key under a key drawn at random once per
// process. Not hash_key (MurmurHash64A with a public seed, kept in object
// headers and tombstones on the card): a key colliding with another key's
// hash_key can be crafted in under a second (and MurmurHash has
// seed-independent collisions), and with the index keyed by it a store of
// such a key took the other key's entry (another tenant's object evicted)
// and keys crafted to one probe run would slow every lookup there. Without
// the secret, two keys share an index hash by chance only (2^-64 a pair);
// the store still compares the whole key in the object's header before it
// serves or deletes an object. Never written to the card: computed at put,
// load and delete, and at recovery from the key in the record's header.
#pragma once

#include <cstdint>
#include <string_view>

namespace adp {

uint64_t index_hash(std::string_view key);

// Tests only (the C++ programs of tests/cpp; not bound to Python): keeps the
// low `bits` bits of every index hash from now on (64: all), so that a test
// can find two keys of one index hash and drive the residual case. Call it
// before the process hashes any key.
void narrow_index_hash_for_tests(int bits);

}  // namespace adp
