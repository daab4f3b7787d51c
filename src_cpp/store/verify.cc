// SPDX-License-Identifier: Apache-2.0
// CardStore::verify: every indexed object read and checked as a load would.
#include <algorithm>
#include <tuple>

#include "store/card_store.h"

namespace adp {

Status CardStore::verify(IoContext& ctx, bool repair, const std::function<void(uint64_t, uint64_t)>& progress,
                         VerifyReport* report) {
  if (repair && read_only_) return read_only_refusal("repair (drop the bad objects)");
  ctx.store_ = this;
  report->damaged_spans = damaged_spans_;  // set at open, never changed after
  std::vector<std::pair<uint64_t, IndexEntry>> entries;
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries.reserve(index_.size());
    index_.for_each([&entries](uint64_t h, const IndexEntry& e) { entries.emplace_back(h, e); });
  }
  // Card order: regions are read front to back.
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return std::make_tuple(a.second.region, uint32_t(a.second.block)) <
           std::make_tuple(b.second.region, uint32_t(b.second.block));
  });
  uint64_t done = 0;
  for (const auto& [hash, e] : entries) {
    bool current;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = index_.find(hash);
      current = it != index_.end() && it->second.seq == e.seq;
    }
    if (current) {
      Status io;
      std::string bad = read_and_check(ctx, hash, e, &io, true);
      if (io.is_not_found() || io.code() == Status::Code::kTimedOut) {
        report->gone++;  // deleted or replaced since the index was read: not judged
      } else if (io.io_class() == Status::IoClass::kGatewayMemory) {
        report->no_memory++;  // no buffer to read it into: not read, and no fault of the object's
        report->no_memory_bytes += e.payload_bytes;
      } else {
        report->checked++;
        report->bytes += e.payload_bytes;
        if (!bad.empty()) {
          report->bad++;
          report->bad_objects.push_back("region " + std::to_string(e.region) + " offset " +
                                        std::to_string(uint64_t(e.block) * kBlockSize) + ": " + bad);
          if (repair && io.ok()) {
            drop_damaged(ctx, hash, e);
            report->repaired++;
          }
        }
      }
    } else {
      report->gone++;  // deleted or replaced since the index was read
    }
    progress(++done, entries.size());
  }
  return Status::Ok();
}

}  // namespace adp
