#include "engine/transport/tcp/socket.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

namespace kolo::transport::tcp {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

StatusOr<sockaddr_in> ParseAddress(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) {
    return InvalidArgument("address '{}' is not of the form a.b.c.d:port", host_port);
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  const std::string host = host_port.substr(0, colon);
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return InvalidArgument("address '{}': '{}' is not an IPv4 address", host_port, host);
  }
  int port = 0;
  const char* begin = host_port.data() + colon + 1;
  const char* end = host_port.data() + host_port.size();
  const auto [ptr, ec] = std::from_chars(begin, end, port);
  if (ec != std::errc() || ptr != end || port <= 0 || port > 65535) {
    return InvalidArgument("address '{}': the port must be an integer in [1, 65535]", host_port);
  }
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

std::string FormatAddress(const sockaddr_in& addr) {
  char ip[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof ip);
  return fmt::format("{}:{}", ip, ntohs(addr.sin_port));
}

std::string PeerAddress(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  return FormatAddress(addr);
}

namespace {

Status SetBuffers(int fd, int64_t buffer_bytes) {
  const int bytes = static_cast<int>(buffer_bytes);
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes) != 0) {
    return ErrnoStatus(StatusCode::kInternal, fmt::format("setsockopt(SO_SNDBUF, {})", bytes),
                       errno);
  }
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes) != 0) {
    return ErrnoStatus(StatusCode::kInternal, fmt::format("setsockopt(SO_RCVBUF, {})", bytes),
                       errno);
  }
  return Status::OK();
}

StatusOr<Fd> NewSocket(int64_t buffer_bytes) {
  if (buffer_bytes <= 0 || buffer_bytes > (int64_t{1} << 30)) {
    return InvalidArgument("socket buffer size {} bytes is outside (0, 1 GiB]", buffer_bytes);
  }
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus(StatusCode::kInternal, "socket(AF_INET, SOCK_STREAM)", errno);
  KOLO_RETURN_IF_ERROR(SetBuffers(fd.get(), buffer_bytes));
  return fd;
}

}  // namespace

Status SetNoDelay(int fd) {
  const int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "setsockopt(TCP_NODELAY)", errno);
  }
  return Status::OK();
}

Status SetMaxPacingRate(int fd, double bytes_per_s) {
  if (!(bytes_per_s >= 0) || !std::isfinite(bytes_per_s)) {
    return InvalidArgument("pacing rate {} bytes/s is not a non-negative number", bytes_per_s);
  }
  // The kernel takes 32 bits (~0U: no cap) and, since Linux 4.20, 64.
  const uint64_t rate =
      bytes_per_s <= 0 ? ~uint64_t{0} : std::max<uint64_t>(1, static_cast<uint64_t>(bytes_per_s));
  int rc;
  if (rate == ~uint64_t{0} || rate < std::numeric_limits<uint32_t>::max()) {
    const uint32_t v = rate == ~uint64_t{0} ? ~0U : static_cast<uint32_t>(rate);
    rc = ::setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &v, sizeof v);
  } else {
    rc = ::setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof rate);
  }
  if (rc != 0) {
    return ErrnoStatus(StatusCode::kInternal,
                       fmt::format("setsockopt(SO_MAX_PACING_RATE, {} bytes/s)", rate), errno);
  }
  return Status::OK();
}

StatusOr<uint64_t> MaxPacingRate(int fd) {
  uint64_t v = 0;
  socklen_t len = sizeof v;
  if (::getsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &v, &len) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "getsockopt(SO_MAX_PACING_RATE)", errno);
  }
  if (len == sizeof(uint32_t)) {
    uint32_t v32 = 0;
    std::memcpy(&v32, &v, sizeof v32);
    return v32 == ~0U ? ~uint64_t{0} : uint64_t{v32};
  }
  return v;
}

StatusOr<Fd> NewStreamSocket(int64_t buffer_bytes) {
  KOLO_ASSIGN_OR_RETURN(Fd fd, NewSocket(buffer_bytes));
  KOLO_RETURN_IF_ERROR(SetNoDelay(fd.get()));
  return fd;
}

StatusOr<Fd> Listen(const std::string& ip, int64_t buffer_bytes, sockaddr_in* bound) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (::inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) {
    return InvalidArgument("listen address '{}' is not an IPv4 address", ip);
  }
  // Accepted sockets inherit the listener's buffer sizes, which must be set before listen().
  KOLO_ASSIGN_OR_RETURN(Fd fd, NewSocket(buffer_bytes));
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    return ErrnoStatus(StatusCode::kUnavailable, fmt::format("bind({}:0)", ip), errno);
  }
  if (::listen(fd.get(), SOMAXCONN) != 0) {
    return ErrnoStatus(StatusCode::kUnavailable, fmt::format("listen({}:0)", ip), errno);
  }
  socklen_t len = sizeof *bound;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(bound), &len) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "getsockname(listener)", errno);
  }
  return fd;
}

}  // namespace kolo::transport::tcp
