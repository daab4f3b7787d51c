// SPDX-License-Identifier: Apache-2.0
// The messages of protocol version 1 (docs/protocol.md): their fields and
// their encoding into / decoding from a frame body. Decoders check every
// count and length against frame.h's bounds before reserving memory; decoded
// string views and spans point into the body, which must outlive them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/frame.h"
#include "util/status.h"

namespace adp::proto {

struct Hello {
  uint32_t features = 0;
  uint64_t ring_bytes = 0;       // size of the ring whose fd rides on this frame; 0 = none
  std::string_view token;        // required on TCP
  std::string_view client_name;  // for the gateway's log
};

struct HelloOk {
  uint32_t features = 0;  // the subset of the client's features in use
  uint32_t max_batch_keys = kMaxBatchKeys;
  uint64_t max_object_bytes = 0;
  uint64_t max_inline_payload = kMaxInlinePayloadBytes;
  std::string_view server;  // the gateway's description, for the client's log
};

struct BatchItem {
  std::string_view key;
  uint64_t size = 0;     // put: payload bytes; get: the client's buffer length
  uint64_t offset = 0;   // put/get: where the bytes are in the ring or inline payload (or the segment)
  uint32_t segment = 0;  // 0 = the ring; 1..kMaxSegments = a registered segment (r3); kProcessSegment (r5)
};

struct BatchRequest {
  Op op = Op::kExists;
  uint32_t timeout_ms = 0;  // what is left of the client's deadline when sent
  std::vector<BatchItem> items;
  std::span<const uint8_t> payload;  // inline payload (TCP put)
};

struct ItemResult {
  Status status;      // Ok, NotFound (miss) or the error, with its message
  uint64_t size = 0;  // get: object bytes delivered
};

struct BatchReply {
  std::vector<ItemResult> results;
  std::span<const uint8_t> payload;  // TCP get: hits' bytes, in item order
};

void encode_hello(const Hello& m, std::vector<uint8_t>* body);
Status decode_hello(std::span<const uint8_t> body, Hello* m);
void encode_hello_ok(const HelloOk& m, std::vector<uint8_t>* body);
Status decode_hello_ok(std::span<const uint8_t> body, HelloOk* m);
// Encodes the table only; an inline payload is sent after it (writev).
void encode_batch(const BatchRequest& m, std::vector<uint8_t>* table);
// `granted`: the connection's process-memory features (r5); an item naming
// kProcessSegment is accepted on a get with kFeatureProcessLoads, on a put
// with kFeatureProcessStores, and nowhere else.
Status decode_batch(std::span<const uint8_t> body, BatchRequest* m, uint32_t granted = 0);
// `classes`: the connection negotiated kFeatureErrorClass (r9). Then each
// I/O error's item carries its class (an unmarked one as the card's) and the
// decoder takes it into the Status; without it that byte is 0, and a nonzero
// one is malformed (as every reserved byte).
void encode_batch_reply(const BatchReply& m, std::vector<uint8_t>* table, bool classes = false);
Status decode_batch_reply(std::span<const uint8_t> body, BatchReply* m, bool classes = false);
// RegisterSegment (r3): the segment's id and size; its fd rides on the frame.
struct RegisterSegment {
  uint32_t id = 0;
  uint64_t bytes = 0;
};
void encode_register_segment(const RegisterSegment& m, std::vector<uint8_t>* body);
Status decode_register_segment(std::span<const uint8_t> body, RegisterSegment* m);
// RegisterProcess (r5): the client's pid as it sees it, and a probe: the
// address of probe.size() bytes in its memory that hold exactly probe.
struct RegisterProcess {
  uint32_t pid = 0;
  uint64_t probe_addr = 0;
  std::span<const uint8_t> probe;
};
void encode_register_process(const RegisterProcess& m, std::vector<uint8_t>* body);
Status decode_register_process(std::span<const uint8_t> body, RegisterProcess* m);
// ProcessOk (r5): the process-memory features granted (0: refused, and
// `reason` says why; the client keeps the ring). r6, where HelloOk granted
// kFeatureStoreLimit: then a u64, the largest object a process store may
// carry (the gateway's store buffer); decoded where present, 0 if not.
struct ProcessOk {
  uint32_t features = 0;
  std::string_view reason;
  bool with_store_limit = false;  // encode: append max_store_object_bytes (r6)
  uint64_t max_store_object_bytes = 0;
};
void encode_process_ok(const ProcessOk& m, std::vector<uint8_t>* body);
Status decode_process_ok(std::span<const uint8_t> body, ProcessOk* m);
void encode_error(std::string_view reason, std::vector<uint8_t>* body);
Status decode_error(std::span<const uint8_t> body, std::string_view* reason);

// Checks one whole frame (header + body) as the gateway or a client would:
// the entry point of the fuzz tests.
Status parse_frame(std::span<const uint8_t> frame);

}  // namespace adp::proto
