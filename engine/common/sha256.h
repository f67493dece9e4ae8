// SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), for the handshakes of the rendezvous store and
// the TCP transport: a peer proves it knows the job secret without sending it. Small inputs only;
// not tuned for throughput.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kolo {

using Digest = std::array<uint8_t, 32>;

// Incremental SHA-256. Thread-compatible (one instance per thread).
class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t size);
  // Finishes the hash; the object must not be updated afterwards.
  Digest Final();

 private:
  void Block(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

// HMAC-SHA-256 of `message` under `key` (any length).
Digest HmacSha256(std::string_view key, const void* message, size_t size);

// Compares two digests in time independent of where they differ.
bool DigestsEqual(const Digest& a, const Digest& b);

}  // namespace kolo
