// Frame layouts and the authentication of the TCP store protocol (described in tcp_store.h).
// Internal to the store.
//
// Handshake: the server sends a challenge carrying a fresh nonce_s; the client answers with a
// hello carrying its own nonce_c and mac_c; the server answers with a verdict carrying mac_s.
//   mac_c = HMAC-SHA-256(secret, "kolo store client proof v1" zero-padded to 64 | nonce_s |
//   nonce_c) mac_s = HMAC-SHA-256(secret, "kolo store server proof v1" zero-padded to 64 | nonce_s
//   | nonce_c)
// The labels differ from each other (a proof cannot be sent back to its author) and from the
// transport's handshake labels (a proof from one cannot serve in the other).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/bootstrap/tcp_store.h"
#include "engine/common/crypto.h"

namespace kolo::bootstrap {

inline constexpr size_t kStoreNonceBytes = 16;
using StoreNonce = std::array<uint8_t, kStoreNonceBytes>;

inline constexpr size_t kChallengeBytes = 20;      // magic, nonce_s
inline constexpr size_t kHelloBytes = 52;          // magic, nonce_c, mac_c
inline constexpr size_t kVerdictBytes = 37;        // magic, accepted, mac_s
inline constexpr size_t kRequestHeaderBytes = 13;  // op, key_len, value_len, timeout_ms
inline constexpr size_t kReplyHeaderBytes = 5;     // code, len
inline constexpr size_t kStoreMaxFrameBytes =
    kRequestHeaderBytes + kStoreMaxKeyBytes + kStoreMaxValueBytes;

inline constexpr uint8_t kOpSet = 1;
inline constexpr uint8_t kOpGet = 2;

inline constexpr uint8_t kReplyOk = 0;
inline constexpr uint8_t kReplyInvalid = 1;
inline constexpr uint8_t kReplyDeadline = 2;

// mac_c: what the client sends to prove it knows `secret`.
Digest StoreClientProof(std::string_view secret, const StoreNonce& server_nonce,
                        const StoreNonce& client_nonce);
// mac_s: what the server sends back to prove it knows `secret` too.
Digest StoreServerProof(std::string_view secret, const StoreNonce& server_nonce,
                        const StoreNonce& client_nonce);

}  // namespace kolo::bootstrap
