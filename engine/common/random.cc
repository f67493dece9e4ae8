#include "engine/common/random.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace kolo {

bool FillRandom(void* buf, size_t n) {
  auto* bytes = static_cast<uint8_t*>(buf);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(bytes + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && errno != EINTR) {
      break;
    }
  }
  if (got == n) return true;
  // Kernels without getrandom (ENOSYS) still have the device.
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  got = 0;
  bool ok = true;
  while (got < n) {
    const ssize_t r = ::read(fd, bytes + got, n - got);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r == 0 || errno != EINTR) {
      ok = false;
      break;
    }
  }
  ::close(fd);
  return ok;
}

}  // namespace kolo
