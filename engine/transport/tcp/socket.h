// Thin RAII and helpers over BSD sockets for the TCP transport: file descriptors, IPv4 addresses,
// socket options. Every socket made here is non-blocking and close-on-exec.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <string>
#include <utility>

#include "engine/common/status.h"

namespace kolo::transport::tcp {

// Owns a file descriptor; closes it on destruction. Movable, not copyable.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// "a.b.c.d:port" <-> sockaddr_in. The parse error names the text and the expected form.
StatusOr<sockaddr_in> ParseAddress(const std::string& host_port);
std::string FormatAddress(const sockaddr_in& addr);
// The remote address of a connected socket, "?" if unknown.
std::string PeerAddress(int fd);

// A non-blocking TCP socket with SO_SNDBUF and SO_RCVBUF set to `buffer_bytes` (before any
// connect or listen, so that the window scale is chosen for them) and TCP_NODELAY.
StatusOr<Fd> NewStreamSocket(int64_t buffer_bytes);

// Sets TCP_NODELAY on an accepted socket (buffer sizes are inherited from the listener).
Status SetNoDelay(int fd);
// SO_MAX_PACING_RATE: the kernel spaces the socket's packets out to at most `bytes_per_s`
// (rounded down to whole bytes; at least 1); 0 lifts the cap. MaxPacingRate reads it back
// (UINT64_MAX: no cap).
Status SetMaxPacingRate(int fd, double bytes_per_s);
StatusOr<uint64_t> MaxPacingRate(int fd);

// A listening socket bound to `ip` on an ephemeral port; *bound receives the address chosen.
StatusOr<Fd> Listen(const std::string& ip, int64_t buffer_bytes, sockaddr_in* bound);

}  // namespace kolo::transport::tcp
