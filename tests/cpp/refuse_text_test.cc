// SPDX-License-Identifier: Apache-2.0
// proto::refuse_at_accept (protocol/socket_io.h), the Error frame of a connection refused at accept: a reason over
// kMaxMessageBytes is cut between UTF-8 characters, as every other text of the protocol (utf34). Until py35 it was
// formatted into a buffer of kMaxMessageBytes + 1, so vsnprintf cut it at the bound itself and a character across
// the bound went out cut in half (its lead byte last: pybind11's strict decode of it raises). Each case refuses one
// end of a socket pair and reads the frame at the other.
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "check.h"
#include "protocol/frame.h"
#include "protocol/socket_io.h"

namespace {

using adp::proto::kFrameHeaderBytes;
using adp::proto::kMaxMessageBytes;

// The reason of the Error frame refuse_at_accept sends for `text` (formatted as the gateway's "%s (%d, ...)"
// refusals are), or "<no frame>".
std::string refused_with(const std::string& text) {
  int sv[2];
  CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
  adp::proto::refuse_at_accept(sv[0], "%s", text.c_str());  // closes sv[0]
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::read(sv[1], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(sv[1]);
  if (got.size() < kFrameHeaderBytes + 2) return "<no frame>";
  adp::proto::FrameHeader h;
  std::memcpy(&h, got.data(), sizeof h);
  uint16_t n;
  std::memcpy(&n, got.data() + kFrameHeaderBytes, sizeof n);
  CHECK(h.type == static_cast<uint8_t>(adp::proto::FrameType::kError), "frame type %d", h.type);
  CHECK(h.body_bytes == 2u + n && got.size() == kFrameHeaderBytes + 2 + n, "frame of %zu bytes, body %u, text %u",
        got.size(), h.body_bytes, n);
  return got.substr(kFrameHeaderBytes + 2);
}

void expect(const std::string& text, const std::string& want, const char* what) {
  const std::string got = refused_with(text);
  CHECK(got == want, "%s: got %zu bytes ending in 0x%02x, want %zu", what, got.size(),
        got.empty() ? 0u : static_cast<unsigned>(static_cast<unsigned char>(got.back())), want.size());
}

}  // namespace

int main() {
  const std::string a255(kMaxMessageBytes - 1, 'a'), a254(kMaxMessageBytes - 2, 'a');
  // "é" (2 bytes) across the bound (bytes 255-256): cut before it, not after its lead byte.
  expect(a255 + "\xc3\xa9 (16, --max-handshakes)", a255, "2-byte character across the bound");
  // "€" (3 bytes) across it (254-256).
  expect(a254 + "\xe2\x82\xac (16, --max-handshakes)", a254, "3-byte character across the bound");
  // "é" ending at the bound (254-255): kept whole.
  expect(a254 + "\xc3\xa9 (16, --max-handshakes)", a254 + "\xc3\xa9", "2-byte character ending at the bound");
  // A short text with a character in it: whole.
  expect("trop de clients locaux \xc3\xa9 (256, --max-clients)", "trop de clients locaux \xc3\xa9 (256, --max-clients)",
         "short text");
  // Exactly the bound, ASCII: whole.
  expect(std::string(kMaxMessageBytes, 'b'), std::string(kMaxMessageBytes, 'b'), "ASCII at the bound");
  return adp::testing::finish("refuse_text_test");
}
