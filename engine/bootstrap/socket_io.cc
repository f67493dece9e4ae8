#include "engine/bootstrap/socket_io.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/common/options.h"

namespace kolo::bootstrap {
namespace {

// Waits until `fd` reports `events` or the deadline passes. EINTR restarts the wait with the
// remaining time, so a signal never shortens or lengthens the bound.
Status WaitFd(int fd, short events, Clock::time_point deadline, const char* what,
              const std::string& peer) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return DeadlineExceeded("{} {}: timed out", what, peer);
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (rc > 0) return Status::OK();
    if (rc < 0 && errno != EINTR) {
      return ErrnoStatus(StatusCode::kInternal, fmt::format("poll ({} {})", what, peer), errno);
    }
  }
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) Reset(other.Release());
  return *this;
}

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

StatusOr<sockaddr_in> ResolveHostPort(const std::string& addr) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size()) {
    return InvalidArgument("address '{}' is not of the form host:port", addr);
  }
  const std::string host = addr.substr(0, colon);
  auto port = ParseInt(fmt::format("port of '{}'", addr), addr.substr(colon + 1), 0, 65535);
  if (!port.ok()) return port.status();

  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(*port));
  if (::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) == 1) return sa;

  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return InvalidArgument("address '{}': host '{}' does not resolve to an IPv4 address ({})", addr,
                           host, rc != 0 ? ::gai_strerror(rc) : "no result");
  }
  sa.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return sa;
}

std::string FormatAddress(const sockaddr_in& sa) {
  char ip[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
  return fmt::format("{}:{}", ip, ntohs(sa.sin_port));
}

bool IsIpv4Address(const std::string& text) {
  in_addr a{};
  return ::inet_pton(AF_INET, text.c_str(), &a) == 1;
}

Status WriteFully(int fd, const void* data, size_t n, Clock::time_point deadline,
                  const std::string& peer) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      KOLO_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline, "sending to", peer));
      continue;
    }
    return ErrnoStatus(StatusCode::kUnavailable, fmt::format("send to {}", peer), errno);
  }
  return Status::OK();
}

Status ReadFully(int fd, void* data, size_t n, Clock::time_point deadline,
                 const std::string& peer) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return Unavailable("connection to {} closed by the peer", peer);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      KOLO_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, "receiving from", peer));
      continue;
    }
    return ErrnoStatus(StatusCode::kUnavailable, fmt::format("recv from {}", peer), errno);
  }
  return Status::OK();
}

}  // namespace kolo::bootstrap
