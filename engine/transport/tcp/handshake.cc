#include "engine/transport/tcp/handshake.h"

#include <algorithm>
#include <cstring>

#include "engine/common/random.h"

namespace kolo::transport::tcp {
namespace {

void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{p[i]} << (8 * i);
  return v;
}

void PutPreamble(uint8_t* p) {
  Put32(p, kHandshakeMagic);
  Put32(p + 4, kProtocolVersion);
}

Status CheckPreamble(const uint8_t* p, const char* what) {
  const uint32_t magic = Get32(p);
  if (magic != kHandshakeMagic) {
    return ProtocolError("{}: wrong magic 0x{:08x} (expected 0x{:08x}; not a kolo peer?)", what,
                         magic, kHandshakeMagic);
  }
  const uint32_t version = Get32(p + 4);
  if (version != kProtocolVersion) {
    return ProtocolError("{}: protocol version {}, this build speaks version {}", what, version,
                         kProtocolVersion);
  }
  return Status::OK();
}

Digest Proof(std::string_view label, std::string_view secret, const Nonce& acceptor_nonce,
             const Hello& hello) {
  uint8_t message[64 + 16 + 16 + 20] = {};
  size_t n = std::min(label.size(), size_t{64});
  std::memcpy(message, label.data(), n);
  std::memcpy(message + 64, acceptor_nonce.data(), 16);
  std::memcpy(message + 80, hello.nonce.data(), 16);
  Put32(message + 96, static_cast<uint32_t>(hello.from_rank));
  Put32(message + 100, static_cast<uint32_t>(hello.to_rank));
  Put32(message + 104, static_cast<uint32_t>(hello.size));
  Put32(message + 108, static_cast<uint32_t>(hello.stream));
  Put32(message + 112, static_cast<uint32_t>(hello.streams));
  return HmacSha256(secret, message, sizeof message);
}

}  // namespace

void Encode(const Challenge& m, uint8_t* out) {
  PutPreamble(out);
  Put32(out + 8, static_cast<uint32_t>(m.acceptor_rank));
  std::memcpy(out + 12, m.nonce.data(), m.nonce.size());
}

void Encode(const Hello& m, uint8_t* out) {
  PutPreamble(out);
  Put32(out + 8, static_cast<uint32_t>(m.from_rank));
  Put32(out + 12, static_cast<uint32_t>(m.to_rank));
  Put32(out + 16, static_cast<uint32_t>(m.size));
  Put32(out + 20, static_cast<uint32_t>(m.stream));
  Put32(out + 24, static_cast<uint32_t>(m.streams));
  std::memcpy(out + 28, m.nonce.data(), m.nonce.size());
  std::memcpy(out + 44, m.mac.data(), m.mac.size());
}

void Encode(const Welcome& m, uint8_t* out) {
  PutPreamble(out);
  std::memcpy(out + 8, m.mac.data(), m.mac.size());
}

Status Decode(const uint8_t* in, Challenge* m) {
  KOLO_RETURN_IF_ERROR(CheckPreamble(in, "challenge"));
  m->acceptor_rank = static_cast<int32_t>(Get32(in + 8));
  std::memcpy(m->nonce.data(), in + 12, m->nonce.size());
  return Status::OK();
}

Status Decode(const uint8_t* in, Hello* m) {
  KOLO_RETURN_IF_ERROR(CheckPreamble(in, "hello"));
  m->from_rank = static_cast<int32_t>(Get32(in + 8));
  m->to_rank = static_cast<int32_t>(Get32(in + 12));
  m->size = static_cast<int32_t>(Get32(in + 16));
  m->stream = static_cast<int32_t>(Get32(in + 20));
  m->streams = static_cast<int32_t>(Get32(in + 24));
  std::memcpy(m->nonce.data(), in + 28, m->nonce.size());
  std::memcpy(m->mac.data(), in + 44, m->mac.size());
  return Status::OK();
}

Status Decode(const uint8_t* in, Welcome* m) {
  KOLO_RETURN_IF_ERROR(CheckPreamble(in, "welcome"));
  std::memcpy(m->mac.data(), in + 8, m->mac.size());
  return Status::OK();
}

Digest ConnectorProof(std::string_view secret, const Nonce& acceptor_nonce, const Hello& hello) {
  return Proof("kolo tcp connector proof v2", secret, acceptor_nonce, hello);
}

Digest AcceptorProof(std::string_view secret, const Nonce& acceptor_nonce, const Hello& hello) {
  return Proof("kolo tcp acceptor proof v2", secret, acceptor_nonce, hello);
}

StatusOr<Nonce> RandomNonce() {
  Nonce nonce;
  if (!FillRandom(nonce.data(), nonce.size())) {
    return Internal("no kernel randomness (getrandom and /dev/urandom both failed) for a nonce");
  }
  return nonce;
}

}  // namespace kolo::transport::tcp
