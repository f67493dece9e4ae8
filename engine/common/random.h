// Random bytes from OpenSSL's generator (seeded by the kernel), for job secrets and handshake
// nonces.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kolo {

// Fills `buf` with `n` random bytes (RAND_bytes).
// False when the generator fails (no kernel randomness); the caller must not go on with
// predictable bytes.
bool FillRandom(void* buf, size_t n);

// SplitMix64's finaliser (Steele, Lea and Flood, 2014): a bijective 64-bit mix with good
// avalanche, for deterministic streams and fingerprints; not a source of secrets.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace kolo
