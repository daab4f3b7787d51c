// SPDX-License-Identifier: Apache-2.0
// The gateway's counters as one JSON object (a StatsReply's body, and
// GatewayServer::stats_json).
#include <cstdio>
#include <string>
#include <type_traits>

#include "gateway/client_handler.h"
#include "protocol/client_segment.h"
#include "util/load_profile.h"

namespace adp {

std::string stats_json(const StoreStats& st, const GatewayShared& shared) {
  std::string out = "{";
  auto field = [&out](const char* k, auto v) {
    char buf[96];
    if constexpr (std::is_same_v<decltype(v), bool>)
      std::snprintf(buf, sizeof buf, "\"%s\":%s,", k, v ? "true" : "false");
    else
      std::snprintf(buf, sizeof buf, "\"%s\":%.17g,", k, static_cast<double>(v));
    out += buf;
  };
  StoreStats with = st;
  with.process_loads = shared.process_loads.load();  // the card's own counts are 0
  with.process_stores = shared.process_stores.load();
  with.lookup_hits = shared.lookup_hits.load();  // counted per key asked by the connections, not by the card
  with.lookup_misses = shared.lookup_misses.load();
  for_each_stat(with, field);
  field("clients", shared.clients.load());
  field("status_queries", shared.status_queries.load());
  field("status_probes", shared.status_probes.load());
  field("usable_cpus", shared.spin_load.cpus);  // what its CPU rules count (spin, piece helpers, store pipeline)
  field("batches", shared.batches.load());
  field("batch_puts", shared.batch_puts.load());
  field("batch_put_ns", shared.batch_put_ns.load());
  field("batch_gets", shared.batch_gets.load());
  field("batch_get_ns", shared.batch_get_ns.load());
  field("batch_spins", shared.batch_spins.load());
  field("batch_spin_hits", shared.batch_spin_hits.load());
  field("ring_bytes", shared.ring_bytes_mapped.load());
  field("ring_used_bytes", shared.ring_bytes_in_use.load());
  field("refused_connections", shared.refused.load());
  field("refused_status_queries", shared.refused_status_queries.load());
  field("accept_backoffs", shared.accept_backoffs.load());
  field("failed_connections", shared.failed_connections.load());
  field("store_reader_failures", shared.store_reader_failures.load());
  field("segments", shared.segments.load());
  field("segment_bytes", proto::ClientSegment::mapped_bytes());
  field("segment_loads", shared.segment_loads.load());
  field("segment_populates", shared.segment_populates.load());
  field("segment_prefault_bytes", shared.segment_prefault ? shared.segment_prefault->bytes() : 0);
  field("segment_prefault_ns", shared.segment_prefault ? shared.segment_prefault->ns() : 0);
  field("segment_prefaults", shared.segment_prefault ? shared.segment_prefault->segments_done() : 0);
  field("segment_prefault_pending", shared.segment_prefault ? shared.segment_prefault->pending() : 0);
  field("segment_stores", shared.segment_stores.load());
  field("ring_piece_loads", shared.ring_piece_loads.load());
  field("process_read_bytes", shared.process_read_bytes.load());
  field("process_store_read_ns", shared.process_store_read_ns.load());
  field("process_store_put_ns", shared.process_store_put_ns.load());
  field("process_store_pipelined", shared.process_store_pipelined.load());
  field("process_store_stalls", shared.process_store_stalls.load());
  field("process_store_overlapped", shared.process_store_overlapped.load());
  field("process_store_unpipelined_busy", shared.process_store_unpipelined_busy.load());
  field("store_buffer_bytes", shared.store_buffer_bytes.load());
  field("store_buffer_busy", shared.store_buffer_busy.load());
  field("load_hold_bytes", shared.load_hold_bytes.load());
  field("load_hold_busy", shared.load_hold_busy.load());
  field("store_buffer_waiting", shared.store_buffer_waiters.load());
  field("processes", shared.processes.load());
  field("process_refusals", shared.process_refusals.load());
  field("process_write_threads", shared.pieces ? shared.pieces->threads() : 0);
  field("process_helper_pieces", shared.pieces ? shared.pieces->helped_pieces() : 0);
  field("process_piece_callers", shared.pieces ? shared.pieces->callers() : 0);
  if (load_profile::kEnabled) {  // ADP_LOAD_PROFILE=1 (benchmarks only)
    uint64_t ns[load_profile::kSteps], n[load_profile::kSteps];
    load_profile::totals(ns, n);
    for (int i = 0; i < load_profile::kSteps; i++) {
      const std::string k = std::string("load_profile_") + load_profile::kNames[i];
      field((k + "_ns").c_str(), ns[i]);
      field((k + "_n").c_str(), n[i]);
    }
  }
  out.back() = '}';
  return out;
}

}  // namespace adp
