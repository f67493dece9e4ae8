// Test helpers for floods of connections at a listener: many client sockets, bounded waits for the
// listener to close them, and the process's stderr captured to count what the listener logged.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace kolo::testing {

// Sends what the process writes to stderr (fd 2, from every thread) to a file until Stop.
class StderrToFile {
 public:
  StderrToFile() {
    char path[] = "/tmp/kolo-test-log-XXXXXX";
    fd_ = ::mkstemp(path);
    path_ = path;
    std::fflush(stderr);
    saved_ = ::dup(2);
    if (fd_ >= 0 && saved_ >= 0) ::dup2(fd_, 2);
  }
  ~StderrToFile() {
    Stop();
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
  }
  StderrToFile(const StderrToFile&) = delete;
  StderrToFile& operator=(const StderrToFile&) = delete;

  bool ok() const { return fd_ >= 0 && saved_ >= 0; }
  // What has been written so far.
  std::string Text() const {
    std::fflush(stderr);
    std::ifstream in(path_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // Gives stderr back. Idempotent.
  void Stop() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }

 private:
  std::string path_;
  int fd_ = -1;
  int saved_ = -1;
};

// The lines of `text` that contain `what`.
inline int LinesWith(const std::string& text, const std::string& what) {
  std::istringstream in(text);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(what) != std::string::npos;
  return n;
}

// The sum of K over the lines of `text` that start with `prefix` and count held-back lines:
// "<prefix>: ... and K more rejected connections in the last N s" (RejectionLog).
inline int64_t CountedInSummaries(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  int64_t sum = 0;
  const std::string marker = prefix + ": ... and ";
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find(marker);
    if (at != std::string::npos &&
        line.find(" more rejected connection", at) != std::string::npos) {
      sum += std::strtoll(line.c_str() + at + marker.size(), nullptr, 10);
    }
  }
  return sum;
}

// Connects to `addr` ("ip:port") within 2 s (a full backlog would hold a plain connect for
// minutes); -1 if not.
inline int ConnectWithin(const std::string& addr) {
  const size_t colon = addr.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(colon + 1))));
  ::inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval bound{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &bound, sizeof bound);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True if the peer closes every one of `fds` within `bound` (what it sends first is dropped).
inline bool AllClosedByPeerWithin(const std::vector<int>& fds, std::chrono::milliseconds bound) {
  std::vector<pollfd> open;
  for (int fd : fds) open.push_back({fd, POLLIN, 0});
  const auto deadline = std::chrono::steady_clock::now() + bound;
  char buf[256];
  while (!open.empty() && std::chrono::steady_clock::now() < deadline) {
    if (::poll(open.data(), open.size(), 100) <= 0) continue;
    for (size_t i = 0; i < open.size();) {
      const ssize_t r =
          open[i].revents != 0 ? ::recv(open[i].fd, buf, sizeof buf, MSG_DONTWAIT) : 1;
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {  // EOF or a reset
        open[i] = open.back();
        open.pop_back();
      } else {
        open[i++].revents = 0;
      }
    }
  }
  return open.empty();
}

// Client sockets of a test, closed however the test ends.
struct ClientFds : std::vector<int> {
  ClientFds() = default;
  ClientFds(const ClientFds&) = delete;
  ClientFds& operator=(const ClientFds&) = delete;
  ~ClientFds() {
    for (int fd : *this) ::close(fd);
  }
};

}  // namespace kolo::testing
