// SPDX-License-Identifier: Apache-2.0
// Gives a card image file just created (empty, open for writing) its size:
// its blocks allocated at once (fallocate, mode 0) or sparse (ftruncate: the
// filesystem allocates them as the first stores write them). CardDevice::Open
// calls it once, for a file it made; docs/card_format.md, "Free space".
#pragma once

#include <cstdint>
#include <string>

#include "util/status.h"

namespace adp {

struct NewImage {
  bool sparse = false;  // left sparse: asked for, on tmpfs/ramfs, or its filesystem cannot allocate without writing
  std::string how;      // for the "created card image" INFO line: what was done and why
};

// Sizes the new image `fd` (at `path`) to `bytes`. Allocated unless
// `sparse_asked` or `memory` (tmpfs/ramfs: allocating there takes the card's
// whole size of memory at once, 0.3 s a GiB here, where sparse it is taken
// as stores fill it). A filesystem without fallocate (EOPNOTSUPP: the
// posix_fallocate fallback would write every block) keeps it sparse.
// NoSpace when the filesystem cannot hold it (`free_bytes`: what it reported
// free before), IoError for another failure: the caller removes the file.
Status size_new_image(int fd, const std::string& path, uint64_t bytes, bool sparse_asked, bool memory,
                      uint64_t free_bytes, NewImage* out);

}  // namespace adp
