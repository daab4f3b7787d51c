// SPDX-License-Identifier: Apache-2.0
#include "protocol/messages.h"

#include <algorithm>
#include <cstring>

#include "protocol/wire.h"
#include "util/clip.h"

namespace adp::proto {
namespace {

// Status codes travel as their numeric value: pin them.
static_assert(static_cast<int>(Status::Code::kOk) == 0 && static_cast<int>(Status::Code::kNotFound) == 1 &&
                  static_cast<int>(Status::Code::kInvalidArgument) == 2 &&
                  static_cast<int>(Status::Code::kNoSpace) == 3 && static_cast<int>(Status::Code::kIoError) == 4 &&
                  static_cast<int>(Status::Code::kCorruption) == 5 && static_cast<int>(Status::Code::kTimedOut) == 6 &&
                  static_cast<int>(Status::Code::kBusy) == 7 && static_cast<int>(Status::Code::kClosed) == 8 &&
                  static_cast<int>(Status::Code::kUnavailable) == 9,
              "wire status codes (docs/protocol.md)");
constexpr uint8_t kMaxStatusCode = 9;

Status malformed(const char* what) { return Status::InvalidArgument(std::string("malformed ") + what); }

// The token only: cut at the byte bound, byte-exact (compared as bytes). Every text (error texts, reasons, names) is
// cut with clip_utf8 instead, between UTF-8 characters: it reaches Python as str, and an error text of over 256
// bytes with a multi-byte character of a card path or key at the bound arrived cut in half, so pybind11's strict
// decoding raised UnicodeDecodeError from the connector's drain_completions (utf34).
std::string_view clip(std::string_view s, size_t n) { return s.substr(0, std::min(s.size(), n)); }

// Misses carry no text; errors carry theirs.
std::string_view wire_message(const Status& s) {
  return s.ok() || s.is_not_found() ? std::string_view() : clip_utf8(s.message(), kMaxMessageBytes);
}

static_assert(static_cast<uint8_t>(Status::IoClass::kCard) == 1 &&
                  static_cast<uint8_t>(Status::IoClass::kGatewayMemory) == 2 &&
                  static_cast<uint8_t>(Status::IoClass::kClientMemory) == kMaxIoClass,
              "wire I/O error classes (docs/protocol.md, r9)");

// r9: an I/O error's class on the wire; an unmarked one is the card's (the
// rule the connector applied to messages before r9).
uint8_t wire_class(const Status& s) {
  if (s.code() != Status::Code::kIoError) return 0;
  const auto c = static_cast<uint8_t>(s.io_class());
  return c ? c : static_cast<uint8_t>(Status::IoClass::kCard);
}

Status status_from_wire(uint8_t code, std::string msg, uint8_t io_class) {
  switch (static_cast<Status::Code>(code)) {
    case Status::Code::kOk:
      return Status::Ok();
    case Status::Code::kNotFound:
      return Status::NotFound();
    case Status::Code::kInvalidArgument:
      return Status::InvalidArgument(std::move(msg));
    case Status::Code::kNoSpace:
      return Status::NoSpace(std::move(msg));
    case Status::Code::kIoError:
      return Status::IoError(std::move(msg), static_cast<Status::IoClass>(io_class));
    case Status::Code::kCorruption:
      return Status::Corruption(std::move(msg));
    case Status::Code::kTimedOut:
      return Status::TimedOut(std::move(msg));
    case Status::Code::kBusy:
      return Status::Busy(std::move(msg));
    case Status::Code::kClosed:
      return Status::Closed(std::move(msg));
    case Status::Code::kUnavailable:
      return Status::Unavailable(std::move(msg));
  }
  return Status::IoError("unknown status code " + std::to_string(code));
}

}  // namespace

void encode_hello(const Hello& m, std::vector<uint8_t>* body) {
  ByteWriter w(body);
  w.put<uint32_t>(m.features);
  w.put<uint32_t>(0);
  w.put<uint64_t>(m.ring_bytes);
  std::string_view token = clip(m.token, kMaxTokenBytes), name = clip_utf8(m.client_name, kMaxNameBytes);
  w.put<uint16_t>(static_cast<uint16_t>(token.size()));
  w.put<uint16_t>(static_cast<uint16_t>(name.size()));
  w.put<uint32_t>(0);
  w.bytes(token);
  w.bytes(name);
}

Status decode_hello(std::span<const uint8_t> body, Hello* m) {
  ByteReader r(body);
  m->features = r.get<uint32_t>();
  uint32_t pad = r.get<uint32_t>();
  m->ring_bytes = r.get<uint64_t>();
  uint16_t token_len = r.get<uint16_t>(), name_len = r.get<uint16_t>();
  pad |= r.get<uint32_t>();
  if (!r.ok() || pad != 0) return malformed("hello");
  if (token_len > kMaxTokenBytes || name_len > kMaxNameBytes) return malformed("hello: token or name too long");
  m->token = r.text(token_len);
  m->client_name = r.text(name_len);
  if (!r.ok() || r.remaining() != 0) return malformed("hello: lengths disagree with the body");
  return Status::Ok();
}

void encode_hello_ok(const HelloOk& m, std::vector<uint8_t>* body) {
  ByteWriter w(body);
  std::string_view server = clip_utf8(m.server, kMaxNameBytes);
  w.put<uint32_t>(m.features);
  w.put<uint32_t>(m.max_batch_keys);
  w.put<uint64_t>(m.max_object_bytes);
  w.put<uint64_t>(m.max_inline_payload);
  w.put<uint32_t>(static_cast<uint32_t>(server.size()));
  w.put<uint32_t>(0);
  w.bytes(server);
}

Status decode_hello_ok(std::span<const uint8_t> body, HelloOk* m) {
  ByteReader r(body);
  m->features = r.get<uint32_t>();
  m->max_batch_keys = r.get<uint32_t>();
  m->max_object_bytes = r.get<uint64_t>();
  m->max_inline_payload = r.get<uint64_t>();
  uint32_t len = r.get<uint32_t>(), pad = r.get<uint32_t>();
  if (!r.ok() || pad != 0 || len > kMaxNameBytes) return malformed("hello reply");
  m->server = r.text(len);
  if (!r.ok() || r.remaining() != 0) return malformed("hello reply: lengths disagree with the body");
  if (m->max_batch_keys == 0 || m->max_batch_keys > kMaxBatchKeys || m->max_object_bytes > kMaxObjectBytes ||
      m->max_inline_payload > kMaxInlinePayloadBytes)
    return malformed("hello reply: limits out of range");
  return Status::Ok();
}

void encode_batch(const BatchRequest& m, std::vector<uint8_t>* table) {
  ByteWriter w(table);
  w.put<uint8_t>(static_cast<uint8_t>(m.op));
  w.put<uint8_t>(0);
  w.put<uint16_t>(0);
  w.put<uint32_t>(static_cast<uint32_t>(m.items.size()));
  w.put<uint32_t>(m.timeout_ms);
  w.put<uint32_t>(0);
  for (const BatchItem& it : m.items) {
    w.put<uint16_t>(static_cast<uint16_t>(it.key.size()));
    w.put<uint16_t>(0);
    w.put<uint32_t>(it.segment);
    w.put<uint64_t>(it.size);
    w.put<uint64_t>(it.offset);
  }
  for (const BatchItem& it : m.items) w.bytes(it.key);
}

Status decode_batch(std::span<const uint8_t> body, BatchRequest* m, uint32_t granted) {
  ByteReader r(body);
  uint8_t op = r.get<uint8_t>();
  uint32_t pad = r.get<uint8_t>();
  pad |= r.get<uint16_t>();
  uint32_t count = r.get<uint32_t>();
  m->timeout_ms = r.get<uint32_t>();
  pad |= r.get<uint32_t>();
  if (!r.ok() || pad != 0) return malformed("batch");
  if (op < static_cast<uint8_t>(Op::kPut) || op > static_cast<uint8_t>(Op::kDelete))
    return malformed("batch: unknown operation");
  m->op = static_cast<Op>(op);
  if (count == 0 || count > kMaxBatchKeys) return malformed("batch: key count out of range");
  if (r.remaining() / kBatchItemBytes < count) return malformed("batch: body shorter than its item table");
  m->items.assign(count, {});
  std::vector<uint16_t> key_len(count);
  for (uint32_t i = 0; i < count; i++) {
    key_len[i] = r.get<uint16_t>();
    uint32_t p = r.get<uint16_t>();
    m->items[i].segment = r.get<uint32_t>();
    m->items[i].size = r.get<uint64_t>();
    m->items[i].offset = r.get<uint64_t>();
    if (p != 0 || key_len[i] == 0 || key_len[i] > kMaxKeyBytes) return malformed("batch: key length out of range");
    const uint32_t seg = m->items[i].segment;
    if (seg == kProcessSegment) {
      const uint32_t needs = m->op == Op::kGet ? kFeatureProcessLoads : m->op == Op::kPut ? kFeatureProcessStores : 0;
      if (!(granted & needs)) return malformed("batch: process memory item without that feature granted");
    } else if (seg > kMaxSegments || (seg != 0 && m->op != Op::kGet && m->op != Op::kPut)) {
      return malformed("batch: segment id out of range");
    }
    if (m->items[i].size > kMaxObjectBytes) return malformed("batch: object size out of range");
  }
  for (uint32_t i = 0; i < count; i++) m->items[i].key = r.text(key_len[i]);
  if (!r.ok()) return malformed("batch: body shorter than its keys");
  m->payload = r.rest();
  if (m->payload.size() > kMaxInlinePayloadBytes) return malformed("batch: inline payload too large");
  return Status::Ok();
}

void encode_batch_reply(const BatchReply& m, std::vector<uint8_t>* table, bool classes) {
  ByteWriter w(table);
  w.put<uint32_t>(static_cast<uint32_t>(m.results.size()));
  w.put<uint32_t>(0);
  for (const ItemResult& res : m.results) {
    w.put<uint8_t>(static_cast<uint8_t>(res.status.code()));
    w.put<uint8_t>(classes ? wire_class(res.status) : 0);
    w.put<uint16_t>(static_cast<uint16_t>(wire_message(res.status).size()));
    w.put<uint32_t>(0);
    w.put<uint64_t>(res.size);
  }
  for (const ItemResult& res : m.results) w.bytes(wire_message(res.status));
}

Status decode_batch_reply(std::span<const uint8_t> body, BatchReply* m, bool classes) {
  ByteReader r(body);
  uint32_t count = r.get<uint32_t>(), pad = r.get<uint32_t>();
  if (!r.ok() || pad != 0 || count > kMaxBatchKeys) return malformed("batch reply");
  if (r.remaining() / kReplyItemBytes < count) return malformed("batch reply: body shorter than its table");
  m->results.assign(count, {});
  std::vector<uint8_t> code(count), io_class(count);
  std::vector<uint16_t> msg_len(count);
  for (uint32_t i = 0; i < count; i++) {
    code[i] = r.get<uint8_t>();
    io_class[i] = r.get<uint8_t>();
    msg_len[i] = r.get<uint16_t>();
    uint32_t p = r.get<uint32_t>();
    m->results[i].size = r.get<uint64_t>();
    if (p != 0 || code[i] > kMaxStatusCode || msg_len[i] > kMaxMessageBytes) return malformed("batch reply: bad item");
    // r9: a class on every I/O error where negotiated, and nowhere else.
    const bool carries = classes && code[i] == static_cast<uint8_t>(Status::Code::kIoError);
    if (carries ? (io_class[i] == 0 || io_class[i] > kMaxIoClass) : io_class[i] != 0)
      return malformed("batch reply: bad error class");
  }
  for (uint32_t i = 0; i < count; i++)
    m->results[i].status = status_from_wire(code[i], std::string(r.text(msg_len[i])), io_class[i]);
  if (!r.ok()) return malformed("batch reply: body shorter than its messages");
  m->payload = r.rest();
  return Status::Ok();
}

void encode_register_segment(const RegisterSegment& m, std::vector<uint8_t>* body) {
  ByteWriter w(body);
  w.put<uint64_t>(m.bytes);
  w.put<uint32_t>(m.id);
  w.put<uint32_t>(0);
}

Status decode_register_segment(std::span<const uint8_t> body, RegisterSegment* m) {
  ByteReader r(body);
  m->bytes = r.get<uint64_t>();
  m->id = r.get<uint32_t>();
  uint32_t pad = r.get<uint32_t>();
  if (!r.ok() || pad != 0 || r.remaining() != 0) return malformed("segment registration");
  if (m->id == 0 || m->id > kMaxSegments) return malformed("segment registration: id out of range");
  if (m->bytes == 0 || m->bytes > kMaxSegmentBytes) return malformed("segment registration: size out of range");
  return Status::Ok();
}

void encode_register_process(const RegisterProcess& m, std::vector<uint8_t>* body) {
  ByteWriter w(body);
  w.put<uint32_t>(m.pid);
  w.put<uint32_t>(static_cast<uint32_t>(m.probe.size()));
  w.put<uint64_t>(m.probe_addr);
  w.bytes(std::string_view(reinterpret_cast<const char*>(m.probe.data()), m.probe.size()));
}

Status decode_register_process(std::span<const uint8_t> body, RegisterProcess* m) {
  ByteReader r(body);
  m->pid = r.get<uint32_t>();
  uint32_t n = r.get<uint32_t>();
  m->probe_addr = r.get<uint64_t>();
  if (!r.ok() || n < kMinProbeBytes || n > kMaxProbeBytes || r.remaining() != n)
    return malformed("process registration");
  if (m->pid == 0) return malformed("process registration: pid 0");
  m->probe = r.rest();
  return Status::Ok();
}

void encode_process_ok(const ProcessOk& m, std::vector<uint8_t>* body) {
  ByteWriter w(body);
  std::string_view reason = clip_utf8(m.reason, kMaxMessageBytes);
  w.put<uint32_t>(m.features);
  w.put<uint16_t>(static_cast<uint16_t>(reason.size()));
  w.put<uint16_t>(0);
  w.bytes(reason);
  if (m.with_store_limit) w.put<uint64_t>(m.max_store_object_bytes);
}

Status decode_process_ok(std::span<const uint8_t> body, ProcessOk* m) {
  ByteReader r(body);
  m->features = r.get<uint32_t>();
  uint16_t n = r.get<uint16_t>(), pad = r.get<uint16_t>();
  if (!r.ok() || pad != 0 || n > kMaxMessageBytes || (m->features & ~kFeatureProcessMemory))
    return malformed("process reply");
  m->reason = r.text(n);
  if (r.ok() && r.remaining() == sizeof(uint64_t)) {  // r6: the store limit
    m->with_store_limit = true;
    m->max_store_object_bytes = r.get<uint64_t>();
  }
  if (!r.ok() || r.remaining() != 0) return malformed("process reply");
  return Status::Ok();
}

void encode_error(std::string_view reason, std::vector<uint8_t>* body) {
  ByteWriter w(body);
  reason = clip_utf8(reason, kMaxMessageBytes);
  w.put<uint16_t>(static_cast<uint16_t>(reason.size()));
  w.bytes(reason);
}

Status decode_error(std::span<const uint8_t> body, std::string_view* reason) {
  ByteReader r(body);
  uint16_t n = r.get<uint16_t>();
  if (n > kMaxMessageBytes) return malformed("error frame");
  *reason = r.text(n);
  if (!r.ok() || r.remaining() != 0) return malformed("error frame");
  return Status::Ok();
}

Status parse_frame(std::span<const uint8_t> frame) {
  FrameHeader h;
  if (frame.size() < sizeof h) return malformed("frame: shorter than its header");
  std::memcpy(&h, frame.data(), sizeof h);
  Status s = check_header(h, kMaxFrameBodyBytes);
  if (!s.ok()) return s;
  std::span<const uint8_t> body = frame.subspan(sizeof h);
  if (body.size() != h.body_bytes) return malformed("frame: body length disagrees with the header");
  switch (static_cast<FrameType>(h.type)) {
    case FrameType::kHello: {
      Hello m;
      return body.size() > kMaxHelloBodyBytes ? malformed("hello: too long") : decode_hello(body, &m);
    }
    case FrameType::kHelloOk: {
      HelloOk m;
      return decode_hello_ok(body, &m);
    }
    case FrameType::kBatch: {
      BatchRequest m;
      return decode_batch(body, &m, kFeatureProcessMemory);
    }
    case FrameType::kBatchReply: {
      BatchReply m;  // as a client of r8 would read it, or one granted error classes (r9)
      Status r8 = decode_batch_reply(body, &m, false);
      return r8.ok() ? r8 : decode_batch_reply(body, &m, true);
    }
    case FrameType::kError: {
      std::string_view reason;
      return decode_error(body, &reason);
    }
    case FrameType::kStats:
      return body.empty() ? Status::Ok() : malformed("stats request: body must be empty");
    case FrameType::kStatsReply:
      return body.size() <= kMaxStatsBytes ? Status::Ok() : malformed("stats reply: too long");
    case FrameType::kRegisterSegment: {
      RegisterSegment m;
      return decode_register_segment(body, &m);
    }
    case FrameType::kSegmentOk:
      return body.empty() ? Status::Ok() : malformed("segment reply: body must be empty");
    case FrameType::kRegisterProcess: {
      RegisterProcess m;
      return decode_register_process(body, &m);
    }
    case FrameType::kProcessOk: {
      ProcessOk m;
      return decode_process_ok(body, &m);
    }
    case FrameType::kAlive:
      return body.empty() ? Status::Ok() : malformed("alive: body must be empty");
  }
  return malformed("frame: unknown type");
}

}  // namespace adp::proto
