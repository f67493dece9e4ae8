#include "engine/common/random.h"

#include <openssl/rand.h>

#include <climits>

namespace kolo {

bool FillRandom(void* buf, size_t n) {
  // OpenSSL's generator, seeded from the kernel (getrandom); it fails rather than hand out
  // predictable bytes.
  auto* bytes = static_cast<unsigned char*>(buf);
  while (n > 0) {
    const int chunk = n > INT_MAX ? INT_MAX : static_cast<int>(n);
    if (RAND_bytes(bytes, chunk) != 1) return false;
    bytes += chunk;
    n -= static_cast<size_t>(chunk);
  }
  return true;
}

}  // namespace kolo
