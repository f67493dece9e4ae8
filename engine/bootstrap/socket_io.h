// Small blocking-socket helpers for the bootstrap (TCP store client and server, kolo-run).
//
// Every wait is bounded by a deadline; no call blocks past it. Errors name the peer address.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/common/status.h"

namespace kolo::bootstrap {

using Clock = std::chrono::steady_clock;

// Owns a file descriptor; closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Parses "host:port" (host: an IPv4 address or a name that resolves to one; port 0..65535).
// The error names `addr` and what is allowed.
StatusOr<sockaddr_in> ResolveHostPort(const std::string& addr);

// "a.b.c.d:port".
std::string FormatAddress(const sockaddr_in& sa);

// True if `text` is a dotted IPv4 address (inet_pton accepts it).
bool IsIpv4Address(const std::string& text);

// Writes all `n` bytes to the (blocking or non-blocking) socket `fd`, waiting for writability
// with poll until `deadline`. Never raises SIGPIPE. Errors name `peer`.
Status WriteFully(int fd, const void* data, size_t n, Clock::time_point deadline,
                  const std::string& peer);

// Reads exactly `n` bytes, waiting with poll until `deadline`. EOF before `n` bytes is Unavailable
// naming `peer`; running past the deadline is DeadlineExceeded.
Status ReadFully(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& peer);

// Little-endian encoding, so that the wire format does not depend on the host.
inline void PutU32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v >> 16);
  p[3] = static_cast<uint8_t>(v >> 24);
}
inline uint32_t GetU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

}  // namespace kolo::bootstrap
