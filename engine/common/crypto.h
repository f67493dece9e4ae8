// The cryptography kolo needs, from OpenSSL's libcrypto: SHA-256 and HMAC-SHA-256 for the
// handshakes of the rendezvous store and the transports (a peer proves it knows the job secret
// without sending it), a constant-time compare, and, for handing the secret to the ranks of an
// mpirun job over MPI's own (unencrypted) channel, X25519 key agreement, HKDF-SHA-256 and
// ChaCha20-Poly1305 (engine/docs/wire.md, "The secret under mpirun").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "engine/common/status.h"

namespace kolo {

using Digest = std::array<uint8_t, 32>;

// Incremental SHA-256. Thread-compatible (one instance per thread).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(const void* data, size_t size);
  // Finishes the hash; the object must not be updated afterwards.
  Digest Final();

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

// HMAC-SHA-256 of `message` under `key` (any length).
Digest HmacSha256(std::string_view key, const void* message, size_t size);

// Compares two digests in time independent of where they differ.
bool DigestsEqual(const Digest& a, const Digest& b);

// An X25519 key pair (RFC 7748) whose private half never leaves this object.
class X25519Key {
 public:
  using PublicKey = std::array<uint8_t, 32>;
  // A fresh key pair from the library's random generator.
  static StatusOr<X25519Key> Generate();
  X25519Key(X25519Key&&) noexcept;
  X25519Key& operator=(X25519Key&&) noexcept;
  ~X25519Key();

  const PublicKey& public_key() const { return public_; }
  // The key both sides derive: HKDF-SHA-256 (RFC 5869) of the X25519 shared secret with `peer`,
  // salted with both public keys in the order (initiator, responder), for `purpose`. An
  // all-zero shared secret (a peer key of small order) is refused.
  StatusOr<Digest> Agree(const PublicKey& peer, const PublicKey& initiator,
                         const PublicKey& responder, std::string_view purpose) const;

 private:
  struct Pkey;
  X25519Key(std::unique_ptr<Pkey> key, const PublicKey& pub);
  std::unique_ptr<Pkey> key_;
  PublicKey public_{};
};

// ChaCha20-Poly1305 (RFC 8439) under a key used for one message only (the nonce is then fixed):
// the ciphertext with its 16-byte tag appended, and the reverse, which fails on any change to
// ciphertext, tag or `aad`.
StatusOr<std::string> SealOnce(const Digest& key, std::string_view aad, std::string_view plain);
StatusOr<std::string> OpenOnce(const Digest& key, std::string_view aad, std::string_view sealed);

// Lower-case hex of `n` bytes, and back (false on an odd length or a non-hex character).
std::string Hex(const void* bytes, size_t n);
bool FromHex(std::string_view hex, std::string* bytes);

}  // namespace kolo
