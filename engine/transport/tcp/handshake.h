// The connection handshake of the TCP transport: wire format and authentication.
//
//   acceptor -> connector  Challenge  magic, version, acceptor rank, nonce_a          (28 bytes)
//   connector -> acceptor  Hello      magic, version, from, to, size, stream, streams, nonce_c,
//                                     mac_c                                         (76 bytes)
//   acceptor -> connector  Welcome    magic, version, mac_a                           (40 bytes)
//
// `stream` numbers the connection among the `streams` the connector opens to the acceptor (0
// carries the frames; 1.. carry parts of striped messages: device.h); the connector's count is
// the pair's. mac_c and mac_a are HMAC-SHA-256 under the job
// secret over both nonces, the ranks, the size and the stream, with a
// different label each way, so each side proves it knows the secret without sending it and a
// recorded exchange cannot be replayed (the acceptor's nonce is fresh). Integers are little-endian.
// A side that rejects the other closes the connection without answering.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/common/crypto.h"
#include "engine/common/status.h"

namespace kolo::transport::tcp {

inline constexpr uint32_t kHandshakeMagic = 0x4f4c4f4b;  // "KOLO" on the wire
inline constexpr uint16_t kProtocolVersion = 2;

using Nonce = std::array<uint8_t, 16>;

struct Challenge {
  int32_t acceptor_rank = -1;
  Nonce nonce{};
  static constexpr size_t kBytes = 28;
};

struct Hello {
  int32_t from_rank = -1;
  int32_t to_rank = -1;
  int32_t size = 0;     // the job size the connector was started with
  int32_t stream = 0;   // which of the pair's streams this connection is (0: the first)
  int32_t streams = 1;  // how many the connector opens
  Nonce nonce{};
  Digest mac{};
  static constexpr size_t kBytes = 76;
};

struct Welcome {
  Digest mac{};
  static constexpr size_t kBytes = 40;
};

void Encode(const Challenge& m, uint8_t* out);
void Encode(const Hello& m, uint8_t* out);
void Encode(const Welcome& m, uint8_t* out);
// Each fails with kProtocol when the magic or the version is wrong; the message names both.
Status Decode(const uint8_t* in, Challenge* m);
Status Decode(const uint8_t* in, Hello* m);
Status Decode(const uint8_t* in, Welcome* m);

// The proofs each side sends; `hello` supplies the ranks, the size and nonce_c (its mac is not
// used).
Digest ConnectorProof(std::string_view secret, const Nonce& acceptor_nonce, const Hello& hello);
Digest AcceptorProof(std::string_view secret, const Nonce& acceptor_nonce, const Hello& hello);

// 16 bytes from the kernel's random source.
StatusOr<Nonce> RandomNonce();

}  // namespace kolo::transport::tcp
