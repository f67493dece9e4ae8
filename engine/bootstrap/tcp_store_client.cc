#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>

#include "engine/bootstrap/tcp_store.h"
#include "engine/bootstrap/tcp_store_wire.h"
#include "engine/common/crypto.h"
#include "engine/common/random.h"

namespace kolo::bootstrap {
namespace {

// Extra time a Get waits for the server's reply beyond the timeout it asked the server for.
constexpr std::chrono::milliseconds kReplyGrace{5000};

bool IsRetryableConnectError(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH ||
         err == ECONNRESET || err == EAGAIN;
}

// One non-blocking connect attempt bounded by `deadline`; returns the socket or the errno.
int TryConnect(const sockaddr_in& sa, Clock::time_point deadline, UniqueFd* out) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return errno;
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) != 0) {
    if (errno != EINPROGRESS) return errno;
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return ETIMEDOUT;
      pollfd p{fd.get(), POLLOUT, 0};
      const int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
      if (rc > 0) break;
      if (rc < 0 && errno != EINTR) return errno;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
    if (err != 0) return err;
  }
  const int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  *out = std::move(fd);
  return 0;
}

}  // namespace

StatusOr<std::unique_ptr<TcpStoreClient>> TcpStoreClient::Connect(
    const std::string& addr, const std::string& secret, std::chrono::milliseconds connect_timeout) {
  if (secret.empty() || secret.size() > kStoreMaxSecretBytes) {
    return InvalidArgument("job secret for the store at {} has {} characters: allowed are 1 to {}",
                           addr, secret.size(), kStoreMaxSecretBytes);
  }
  KOLO_ASSIGN_OR_RETURN(const sockaddr_in sa, ResolveHostPort(addr));
  const auto start = Clock::now();
  const auto deadline = start + connect_timeout;
  auto backoff = std::chrono::milliseconds(10);
  UniqueFd fd;
  for (;;) {
    const int err = TryConnect(sa, deadline, &fd);
    if (err == 0) break;
    if (!IsRetryableConnectError(err)) {
      return ErrnoStatus(StatusCode::kUnavailable, fmt::format("connect to the store at {}", addr),
                         err);
    }
    if (Clock::now() + backoff >= deadline) {
      return DeadlineExceeded(
          "could not connect to the store at {} within {} ms (last error: {}); is the launcher "
          "(kolo-run, or rank 0 under mpirun) running and reachable?",
          addr, connect_timeout.count(), std::strerror(err));
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }

  // The handshake gets its own short bound, so that a connection made just before the deadline
  // still has time to be answered.
  const auto hs_deadline = std::max(deadline, Clock::now() + std::chrono::seconds(5));
  const std::string peer = fmt::format("the store at {}", addr);
  const auto handshake_failed = [&](const Status& s) {
    return Status(s.code(), fmt::format("handshake with the store at {} failed ({}); is it a "
                                        "kolo store of this version?",
                                        addr, s.message()));
  };
  uint8_t challenge[kChallengeBytes];
  Status read = ReadFully(fd.get(), challenge, sizeof(challenge), hs_deadline, peer);
  if (!read.ok()) return handshake_failed(read);
  if (GetU32(challenge) != kStoreMagic) {
    return ProtocolError(
        "the server at {} is not a kolo store of this version (bad magic 0x{:08x})", addr,
        GetU32(challenge));
  }
  StoreNonce server_nonce;
  std::memcpy(server_nonce.data(), challenge + 4, kStoreNonceBytes);
  StoreNonce client_nonce;
  if (!FillRandom(client_nonce.data(), client_nonce.size())) {
    return Internal(
        "no kernel randomness (getrandom and /dev/urandom both failed) for the "
        "handshake with the store at {}",
        addr);
  }
  // Only the proof goes on the wire, never the secret.
  const Digest proof = StoreClientProof(secret, server_nonce, client_nonce);
  uint8_t hello[kHelloBytes];
  PutU32(hello, kStoreMagic);
  std::memcpy(hello + 4, client_nonce.data(), kStoreNonceBytes);
  std::memcpy(hello + 4 + kStoreNonceBytes, proof.data(), proof.size());
  KOLO_RETURN_IF_ERROR(WriteFully(fd.get(), hello, sizeof(hello), hs_deadline, peer));
  uint8_t verdict[kVerdictBytes];
  read = ReadFully(fd.get(), verdict, sizeof(verdict), hs_deadline, peer);
  if (!read.ok()) return handshake_failed(read);
  if (GetU32(verdict) != kStoreMagic) {
    return ProtocolError("the server at {} is not a kolo store (bad magic 0x{:08x})", addr,
                         GetU32(verdict));
  }
  if (verdict[4] == 0) {
    return InvalidArgument(
        "the store at {} rejected the job secret: KOLO_JOB_SECRET must be the secret of the job "
        "that started the store",
        addr);
  }
  if (verdict[4] != 1) {
    return ProtocolError("the store at {} sent verdict {} (expected 0 or 1)", addr, verdict[4]);
  }
  Digest server_proof;
  std::memcpy(server_proof.data(), verdict + 5, server_proof.size());
  if (!DigestsEqual(server_proof, StoreServerProof(secret, server_nonce, client_nonce))) {
    return Unavailable(
        "the server at {} failed to prove the job secret: it is not the store of this job (or "
        "something between this rank and the store is answering for it)",
        addr);
  }
  return std::unique_ptr<TcpStoreClient>(new TcpStoreClient(addr, std::move(fd), connect_timeout));
}

StatusOr<uint8_t> TcpStoreClient::Call(uint8_t op, const std::string& key,
                                       const std::vector<uint8_t>& value, uint32_t timeout_ms,
                                       Clock::time_point deadline, std::vector<uint8_t>* payload) {
  if (key.empty() || key.size() > kStoreMaxKeyBytes) {
    return InvalidArgument("store key of {} bytes: allowed are 1 to {} bytes", key.size(),
                           kStoreMaxKeyBytes);
  }
  if (value.size() > kStoreMaxValueBytes) {
    return InvalidArgument("value of {} bytes for store key '{}': at most {} bytes are allowed",
                           value.size(), key, kStoreMaxValueBytes);
  }
  MutexLock lock(mu_);
  if (!broken_.ok()) return broken_;
  std::vector<uint8_t> frame(kRequestHeaderBytes + key.size() + value.size());
  frame[0] = op;
  PutU32(frame.data() + 1, static_cast<uint32_t>(key.size()));
  PutU32(frame.data() + 5, static_cast<uint32_t>(value.size()));
  PutU32(frame.data() + 9, timeout_ms);
  std::copy(key.begin(), key.end(), frame.begin() + kRequestHeaderBytes);
  std::copy(value.begin(), value.end(), frame.begin() + kRequestHeaderBytes + key.size());

  const std::string peer = fmt::format("the store at {} (key '{}')", address_, key);
  uint8_t header[kReplyHeaderBytes];
  Status s = WriteFully(fd_.get(), frame.data(), frame.size(), deadline, peer);
  if (s.ok()) s = ReadFully(fd_.get(), header, sizeof(header), deadline, peer);
  if (s.ok()) {
    const uint32_t len = GetU32(header + 1);
    if (header[0] > kReplyDeadline || len > kStoreMaxValueBytes + kStoreMaxKeyBytes) {
      s = ProtocolError("the store at {} sent a reply with code {} and {} bytes", address_,
                        header[0], len);
    } else {
      payload->resize(len);
      s = ReadFully(fd_.get(), payload->data(), len, deadline, peer);
    }
  }
  if (!s.ok()) {
    // The stream position is unknown after a failed exchange, so the connection cannot be reused.
    broken_ = s;
    fd_.Reset();
    return s;
  }
  return header[0];
}

Status TcpStoreClient::Set(const std::string& key, const std::vector<uint8_t>& value) {
  std::vector<uint8_t> payload;
  KOLO_ASSIGN_OR_RETURN(const uint8_t code,
                        Call(kOpSet, key, value, 0, Clock::now() + io_timeout_, &payload));
  if (code == kReplyOk) return Status::OK();
  return InvalidArgument("{} (store at {})", std::string(payload.begin(), payload.end()), address_);
}

StatusOr<std::vector<uint8_t>> TcpStoreClient::Get(const std::string& key,
                                                   std::chrono::milliseconds timeout) {
  const int64_t ms = std::clamp<int64_t>(timeout.count(), 0, INT32_MAX);
  std::vector<uint8_t> payload;
  KOLO_ASSIGN_OR_RETURN(const uint8_t code,
                        Call(kOpGet, key, {}, static_cast<uint32_t>(ms),
                             Clock::now() + std::chrono::milliseconds(ms) + kReplyGrace, &payload));
  if (code == kReplyOk) return payload;
  if (code == kReplyDeadline) {
    return DeadlineExceeded("store key '{}' was not set within {} ms (store at {})", key, ms,
                            address_);
  }
  return InvalidArgument("{} (store at {})", std::string(payload.begin(), payload.end()), address_);
}

}  // namespace kolo::bootstrap
