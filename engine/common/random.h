// Bytes from the kernel's random source, for job secrets and handshake nonces.
#pragma once

#include <cstddef>

namespace kolo {

// Fills `buf` with `n` random bytes from getrandom, or from /dev/urandom on kernels without it.
// False when neither is usable; the caller must not go on with predictable bytes.
bool FillRandom(void* buf, size_t n);

}  // namespace kolo
