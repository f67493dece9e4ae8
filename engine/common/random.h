// Random bytes from OpenSSL's generator (seeded by the kernel), for job secrets and handshake nonces.
#pragma once

#include <cstddef>

namespace kolo {

// Fills `buf` with `n` random bytes (RAND_bytes).
// False when the generator fails (no kernel randomness); the caller must not go on with
// predictable bytes.
bool FillRandom(void* buf, size_t n);

}  // namespace kolo
