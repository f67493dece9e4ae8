// The TCP store: a key-value Store served over TCP, for launches where ranks are processes.
//
// kolo-run hosts a TcpStoreServer in the launcher; under mpirun rank 0 hosts it and shares its
// address and secret over MPI. Every rank talks to it through a TcpStoreClient.
//
// Wire protocol (all integers little-endian u32 unless noted; sizes bounded, see the constants):
//   challenge server -> client  magic "KST2" | nonce_s (16 random bytes, fresh per connection)
//   hello     client -> server  magic | nonce_c (16 random bytes) | mac_c (32 bytes)
//   verdict   server -> client  magic | u8 accepted (1) or wrong secret (0, then close) |
//                               mac_s (32 bytes; zeros when rejected)
//   request   client -> server  u8 op (1 Set, 2 Get) | key_len | value_len | timeout_ms | key |
//                               value
//   reply     server -> client  u8 code (0 OK, 1 InvalidArgument, 2 DeadlineExceeded) | len |
//                               bytes
// mac_c and mac_s are HMAC-SHA-256 under the job secret over a label and both nonces, with a
// different label each way (tcp_store_wire.h): each side proves it knows the secret without
// sending it, the client also learns that the server knows it, and a recorded hello is useless on
// a new connection (the server's nonce is fresh). A client fails when mac_s is wrong.
// A Get that finds no key waits on the server until the key is set or timeout_ms passes. A client
// has one request outstanding at a time. A connection that sends anything else (bad magic,
// oversized frame, unknown op, no hello within the hello timeout) is closed; the server keeps
// serving. However many connections are turned away, and whichever way, the server writes at most
// a few lines per 10 s about them (one RejectionLog, engine/common/logging.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/bootstrap/socket_io.h"
#include "engine/bootstrap/store.h"
#include "engine/common/logging.h"
#include "engine/common/mutex.h"
#include "engine/common/status.h"
#include "engine/common/thread_annotations.h"

namespace kolo::bootstrap {

inline constexpr uint32_t kStoreMagic = 0x3254534b;  // "KST2" on the wire
inline constexpr size_t kStoreMaxSecretBytes = 256;
inline constexpr size_t kStoreMaxKeyBytes = 4096;
inline constexpr size_t kStoreMaxValueBytes = 16 << 20;

struct TcpStoreServerOptions {
  // IPv4 address to bind, and port (0 = an ephemeral port; see address()).
  std::string host = "127.0.0.1";
  int port = 0;
  // The job secret every client must prove it knows (at least 16 characters).
  std::string secret;
  // A connection that has not completed its hello within this long is closed.
  std::chrono::milliseconds hello_timeout{5000};
  // Connections beyond this many are accepted and closed at once.
  size_t max_connections = 4096;
};

// Serves Set/Get to many clients at once from one thread (epoll). Thread-safe: the accessors may be
// called from any thread while the server runs.
class TcpStoreServer {
 public:
  // Binds, listens and starts the serving thread. Errors name the host and port.
  static StatusOr<std::unique_ptr<TcpStoreServer>> Start(TcpStoreServerOptions options);
  // Stops (as Stop).
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // "ip:port" that clients connect to.
  const std::string& address() const { return address_; }
  // Closes every connection and joins the serving thread. Idempotent. Pending Gets end with the
  // connection (their clients see Unavailable).
  void Stop() KOLO_EXCLUDES(stop_mu_);

  // Connections turned away: a wrong secret, a protocol violation, a hello timeout, one beyond
  // max_connections.
  uint64_t rejected_connections() const { return rejected_.load(); }
  // Connections whose hello was accepted.
  uint64_t accepted_clients() const { return accepted_.load(); }

 private:
  struct Conn;
  class Loop;
  TcpStoreServer() = default;

  std::string address_;
  UniqueFd wake_fd_;  // eventfd: Stop() writes it to end the serving thread's wait
  // Set by Start before the server is returned to anyone; afterwards only Stop (under stop_mu_)
  // touches them. Not KOLO_GUARDED_BY(stop_mu_) for Start's unlocked writes.
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  Mutex stop_mu_;  // serialises Stop()
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> accepted_{0};
};

// A Store backed by a TcpStoreServer. Thread-safe: requests from several threads are serialised.
// After an I/O error the connection is unusable and every later call fails with that error.
class TcpStoreClient final : public Store {
 public:
  // Connects to `addr` ("host:port") and proves that it knows `secret` (which never goes on the
  // wire); the server proves it too. Retries refused or unreachable connections until
  // `connect_timeout` passes, so ranks may start before the server. Also the bound of each Set.
  // Errors name the address; a wrong secret says so, and so does a server that cannot prove it.
  static StatusOr<std::unique_ptr<TcpStoreClient>> Connect(
      const std::string& addr, const std::string& secret,
      std::chrono::milliseconds connect_timeout = std::chrono::seconds(30));

  Status Set(const std::string& key, const std::vector<uint8_t>& value) override KOLO_EXCLUDES(mu_);
  // Waits on the server; the whole call is bounded by `timeout` plus a short grace for the reply.
  StatusOr<std::vector<uint8_t>> Get(const std::string& key,
                                     std::chrono::milliseconds timeout) override KOLO_EXCLUDES(mu_);

  const std::string& address() const { return address_; }

 private:
  TcpStoreClient(std::string address, UniqueFd fd, std::chrono::milliseconds io_timeout)
      : address_(std::move(address)), fd_(std::move(fd)), io_timeout_(io_timeout) {}
  // Sends one request and reads its reply into *payload; returns the reply code.
  StatusOr<uint8_t> Call(uint8_t op, const std::string& key, const std::vector<uint8_t>& value,
                         uint32_t timeout_ms, Clock::time_point deadline,
                         std::vector<uint8_t>* payload) KOLO_EXCLUDES(mu_);

  const std::string address_;
  Mutex mu_;
  UniqueFd fd_ KOLO_GUARDED_BY(mu_);
  Status broken_ KOLO_GUARDED_BY(mu_);  // sticky I/O error
  std::chrono::milliseconds io_timeout_;
};

}  // namespace kolo::bootstrap
