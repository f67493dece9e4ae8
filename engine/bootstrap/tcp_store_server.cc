#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "engine/bootstrap/tcp_store.h"
#include "engine/bootstrap/tcp_store_wire.h"
#include "engine/common/crypto.h"
#include "engine/common/logging.h"
#include "engine/common/random.h"

namespace kolo::bootstrap {

// Per-connection state, touched only by the serving thread.
struct TcpStoreServer::Conn {
  UniqueFd fd;
  std::string peer;
  bool authed = false;
  StoreNonce nonce{};    // the challenge's nonce_s
  bool closing = false;  // close once `out` is flushed (after a rejection verdict)
  bool dead = false;     // swept at the end of the current loop iteration
  Clock::time_point hello_deadline;
  std::vector<uint8_t> in;
  std::vector<uint8_t> out;
  size_t out_off = 0;
  bool waiting = false;  // a Get parked until its key is set
  std::string wait_key;
  Clock::time_point wait_deadline;
  uint32_t interest = 0;  // epoll events currently registered
};

class TcpStoreServer::Loop {
 public:
  Loop(TcpStoreServerOptions options, std::string address, UniqueFd listen_fd, UniqueFd epoll_fd,
       int wake_fd, TcpStoreServer* owner)
      : options_(std::move(options)),
        address_(std::move(address)),
        listen_fd_(std::move(listen_fd)),
        epoll_fd_(std::move(epoll_fd)),
        wake_fd_(wake_fd),
        owner_(owner),
        rejections_(fmt::format("store {}", address_)) {}

  void Run();

 private:
  void Accept();
  void OnEvent(Conn& c, uint32_t events);
  void Process(Conn& c);
  bool ProcessHello(Conn& c);
  bool ProcessRequest(Conn& c);
  void SendReply(Conn& c, uint8_t code, const uint8_t* data, size_t n);
  void Flush(Conn& c);
  void UpdateInterest(Conn& c);
  void Reject(Conn& c, const std::string& why);
  // Every turned-away connection is logged through here: a few lines per 10 s, the rest counted.
  void LogRejection(LogLevel level, const std::string& peer, const std::string& why);
  void ExpireDeadlines();
  void Sweep();
  int NextTimeoutMs() const;
  void RemoveWaiter(Conn& c);

  const TcpStoreServerOptions options_;
  const std::string address_;
  UniqueFd listen_fd_;
  UniqueFd epoll_fd_;
  const int wake_fd_;
  TcpStoreServer* const owner_;
  // Hundreds of idle or garbage connections from a local user must not flood the job's log.
  RejectionLog rejections_;
  std::map<int, std::unique_ptr<Conn>> conns_;        // by fd
  std::map<std::string, std::vector<uint8_t>> data_;  // the store's contents
  std::multimap<std::string, int> waiters_;           // key -> fd of a parked Get
  std::vector<int> ready_;  // conns woken by a Set, to process after the current event
};

StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(TcpStoreServerOptions options) {
  if (options.secret.size() < 16 || options.secret.size() > kStoreMaxSecretBytes) {
    return InvalidArgument("store secret has {} characters: allowed are 16 to {}",
                           options.secret.size(), kStoreMaxSecretBytes);
  }
  const std::string where = fmt::format("{}:{}", options.host, options.port);
  KOLO_ASSIGN_OR_RETURN(sockaddr_in sa, ResolveHostPort(where));
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoStatus(StatusCode::kInternal, "socket (store server)", errno);
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    return ErrnoStatus(StatusCode::kUnavailable, fmt::format("bind store server to {}", where),
                       errno);
  }
  if (::listen(fd.get(), 1024) != 0) {
    return ErrnoStatus(StatusCode::kUnavailable, fmt::format("listen on {}", where), errno);
  }
  socklen_t len = sizeof(sa);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "getsockname (store server)", errno);
  }
  UniqueFd epfd(::epoll_create1(EPOLL_CLOEXEC));
  if (!epfd.valid()) return ErrnoStatus(StatusCode::kInternal, "epoll_create1 (store)", errno);
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer());
  server->wake_fd_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!server->wake_fd_.valid()) return ErrnoStatus(StatusCode::kInternal, "eventfd", errno);
  for (int f : {fd.get(), server->wake_fd_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = f;
    if (::epoll_ctl(epfd.get(), EPOLL_CTL_ADD, f, &ev) != 0) {
      return ErrnoStatus(StatusCode::kInternal, "epoll_ctl ADD (store)", errno);
    }
  }
  server->address_ = FormatAddress(sa);
  server->loop_ = std::make_unique<Loop>(std::move(options), server->address_, std::move(fd),
                                         std::move(epfd), server->wake_fd_.get(), server.get());
  server->thread_ = std::thread([loop = server->loop_.get()] { loop->Run(); });
  return server;
}

TcpStoreServer::~TcpStoreServer() { Stop(); }

void TcpStoreServer::Stop() {
  MutexLock lock(stop_mu_);
  if (thread_.joinable()) {
    const uint64_t one = 1;
    // An eventfd write only fails when the counter would overflow, which one write cannot do.
    [[maybe_unused]] ssize_t w = ::write(wake_fd_.get(), &one, sizeof(one));
    thread_.join();
  }
  loop_.reset();  // closes the listener and every connection
}

void TcpStoreServer::Loop::Run() {
  epoll_event events[64];
  for (;;) {
    const int n = ::epoll_wait(epoll_fd_.get(), events, 64, NextTimeoutMs());
    if (n < 0 && errno != EINTR) {
      KOLO_LOG(kError, "store {}: epoll_wait failed (errno {}); the store stops serving", address_,
               errno);
      return;
    }
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) return;
      if (fd == listen_fd_.get()) {
        Accept();
        continue;
      }
      auto it = conns_.find(fd);
      if (it != conns_.end() && !it->second->dead) OnEvent(*it->second, events[i].events);
    }
    ExpireDeadlines();
    rejections_.Flush();
    while (!ready_.empty()) {
      const int fd = ready_.back();
      ready_.pop_back();
      auto it = conns_.find(fd);
      if (it != conns_.end() && !it->second->dead) Process(*it->second);
    }
    Sweep();
  }
}

void TcpStoreServer::Loop::Accept() {
  for (;;) {
    sockaddr_in sa{};
    socklen_t len = sizeof(sa);
    const int fd = ::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&sa), &len,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // EAGAIN: drained. EMFILE and the like: the pending connection waits in the backlog and is
      // retried on the next readiness report.
      return;
    }
    UniqueFd owned(fd);
    const std::string peer = FormatAddress(sa);
    if (conns_.size() >= options_.max_connections) {
      owner_->rejected_++;
      LogRejection(LogLevel::kWarning, peer,
                   fmt::format("{} connections already open (at most {} allowed)", conns_.size(),
                               options_.max_connections));
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto c = std::make_unique<Conn>();
    c->peer = peer;
    if (!FillRandom(c->nonce.data(), c->nonce.size())) {
      owner_->rejected_++;
      LogRejection(LogLevel::kError, peer, "no kernel randomness for its challenge");
      continue;
    }
    c->hello_deadline = Clock::now() + options_.hello_timeout;
    c->interest = EPOLLIN | EPOLLRDHUP;
    epoll_event ev{};
    ev.events = c->interest;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      owner_->rejected_++;
      LogRejection(LogLevel::kWarning, peer, fmt::format("epoll_ctl failed (errno {})", errno));
      continue;
    }
    c->fd = std::move(owned);
    // The challenge: a fresh nonce that the client's proof must cover.
    uint8_t challenge[kChallengeBytes];
    PutU32(challenge, kStoreMagic);
    std::memcpy(challenge + 4, c->nonce.data(), kStoreNonceBytes);
    c->out.assign(challenge, challenge + sizeof(challenge));
    Conn& conn = *c;
    conns_[fd] = std::move(c);
    Flush(conn);
    if (!conn.dead) UpdateInterest(conn);
  }
}

void TcpStoreServer::Loop::OnEvent(Conn& c, uint32_t events) {
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
    uint8_t buf[64 << 10];
    for (;;) {
      const ssize_t r = ::recv(c.fd.get(), buf, sizeof(buf), 0);
      if (r > 0) {
        c.in.insert(c.in.end(), buf, buf + r);
        // Before its hello is answered a client has nothing to send but the hello.
        if (!c.authed && c.in.size() > kHelloBytes) {
          Reject(c, fmt::format("sent more than the {} bytes of a hello before its verdict",
                                kHelloBytes));
          return;
        }
        if (c.in.size() > kStoreMaxFrameBytes) {
          Reject(c, fmt::format("sent more than {} bytes without waiting for a reply",
                                kStoreMaxFrameBytes));
          return;
        }
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      // EOF or a reset: the client is gone. A departure after the hello is ordinary; before it,
      // it is someone who is not a kolo client.
      if (!c.authed) {
        Reject(c, "closed before completing the hello");
      } else {
        c.dead = true;
      }
      return;
    }
  }
  if (events & EPOLLOUT) Flush(c);
  if (!c.dead) Process(c);
}

void TcpStoreServer::Loop::Process(Conn& c) {
  while (!c.dead && !c.closing && !c.waiting && c.out.empty()) {
    const bool progressed = c.authed ? ProcessRequest(c) : ProcessHello(c);
    if (!progressed) break;
  }
  if (!c.dead) UpdateInterest(c);
}

bool TcpStoreServer::Loop::ProcessHello(Conn& c) {
  if (c.in.size() < 4) return false;
  const uint32_t magic = GetU32(c.in.data());
  if (magic != kStoreMagic) {
    Reject(c, fmt::format("bad magic 0x{:08x} (not a kolo store client of this version)", magic));
    return false;
  }
  if (c.in.size() < kHelloBytes) return false;
  StoreNonce client_nonce;
  std::memcpy(client_nonce.data(), c.in.data() + 4, kStoreNonceBytes);
  Digest proof;
  std::memcpy(proof.data(), c.in.data() + 4 + kStoreNonceBytes, proof.size());
  const bool ok = DigestsEqual(proof, StoreClientProof(options_.secret, c.nonce, client_nonce));
  c.in.erase(c.in.begin(), c.in.begin() + kHelloBytes);
  uint8_t verdict[kVerdictBytes] = {};
  PutU32(verdict, kStoreMagic);
  verdict[4] = ok ? 1 : 0;
  if (ok) {
    const Digest answer = StoreServerProof(options_.secret, c.nonce, client_nonce);
    std::memcpy(verdict + 5, answer.data(), answer.size());
  }
  c.out.assign(verdict, verdict + sizeof(verdict));
  if (ok) {
    c.authed = true;
    owner_->accepted_++;
  } else {
    owner_->rejected_++;
    LogRejection(LogLevel::kWarning, c.peer, "wrong job secret");
    c.closing = true;
  }
  Flush(c);
  return true;
}

bool TcpStoreServer::Loop::ProcessRequest(Conn& c) {
  if (c.in.size() < kRequestHeaderBytes) return false;
  const uint8_t op = c.in[0];
  const uint32_t key_len = GetU32(c.in.data() + 1);
  const uint32_t value_len = GetU32(c.in.data() + 5);
  const uint32_t timeout_ms = GetU32(c.in.data() + 9);
  if (op != kOpSet && op != kOpGet) {
    Reject(c, fmt::format("unknown request type {}", op));
    return false;
  }
  if (key_len == 0 || key_len > kStoreMaxKeyBytes || value_len > kStoreMaxValueBytes ||
      (op == kOpGet && value_len != 0)) {
    Reject(c, fmt::format("request with key of {} bytes and value of {} bytes: allowed are keys "
                          "of 1 to {} bytes and values up to {} bytes (none for a get)",
                          key_len, value_len, kStoreMaxKeyBytes, kStoreMaxValueBytes));
    return false;
  }
  const size_t total = kRequestHeaderBytes + key_len + value_len;
  if (c.in.size() < total) return false;
  const auto* key_begin = c.in.data() + kRequestHeaderBytes;
  std::string key(key_begin, key_begin + key_len);
  std::vector<uint8_t> value(key_begin + key_len, key_begin + key_len + value_len);
  c.in.erase(c.in.begin(), c.in.begin() + static_cast<ptrdiff_t>(total));

  if (op == kOpSet) {
    auto it = data_.find(key);
    if (it != data_.end()) {
      // Re-setting the same value is allowed (an idempotent retry); a different one is not.
      if (it->second == value) {
        SendReply(c, kReplyOk, nullptr, 0);
      } else {
        const std::string msg =
            fmt::format("store key '{}' is already set to a different value", key);
        SendReply(c, kReplyInvalid, reinterpret_cast<const uint8_t*>(msg.data()), msg.size());
      }
      return true;
    }
    it = data_.emplace(key, std::move(value)).first;
    SendReply(c, kReplyOk, nullptr, 0);
    auto range = waiters_.equal_range(key);
    for (auto w = range.first; w != range.second; ++w) {
      auto wc = conns_.find(w->second);
      if (wc == conns_.end() || wc->second->dead) continue;
      Conn& waiter = *wc->second;
      waiter.waiting = false;
      SendReply(waiter, kReplyOk, it->second.data(), it->second.size());
      ready_.push_back(waiter.fd.get());
    }
    waiters_.erase(range.first, range.second);
    return true;
  }

  auto it = data_.find(key);
  if (it != data_.end()) {
    SendReply(c, kReplyOk, it->second.data(), it->second.size());
  } else if (timeout_ms == 0) {
    SendReply(c, kReplyDeadline, nullptr, 0);
  } else {
    c.waiting = true;
    c.wait_key = key;
    c.wait_deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    waiters_.emplace(std::move(key), c.fd.get());
  }
  return true;
}

void TcpStoreServer::Loop::SendReply(Conn& c, uint8_t code, const uint8_t* data, size_t n) {
  uint8_t header[kReplyHeaderBytes];
  header[0] = code;
  PutU32(header + 1, static_cast<uint32_t>(n));
  c.out.insert(c.out.end(), header, header + sizeof(header));
  if (n > 0) c.out.insert(c.out.end(), data, data + n);
  Flush(c);
}

void TcpStoreServer::Loop::Flush(Conn& c) {
  while (c.out_off < c.out.size()) {
    const ssize_t w = ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      c.out_off += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    c.dead = true;  // the client is gone; nothing to tell it
    return;
  }
  c.out.clear();
  c.out_off = 0;
  if (c.closing) c.dead = true;
}

void TcpStoreServer::Loop::UpdateInterest(Conn& c) {
  // Read only when ready for the next request, so a client cannot queue work without bound; keep
  // EPOLLRDHUP so that a departure is noticed even while its Get is parked.
  uint32_t want = EPOLLRDHUP;
  if (!c.out.empty()) want |= EPOLLOUT;
  if (!c.waiting && c.out.empty() && !c.closing) want |= EPOLLIN;
  if (want == c.interest) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.fd = c.fd.get();
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev) != 0) {
    c.dead = true;
    return;
  }
  c.interest = want;
}

void TcpStoreServer::Loop::Reject(Conn& c, const std::string& why) {
  owner_->rejected_++;
  LogRejection(LogLevel::kWarning, c.peer, why);
  c.dead = true;
}

void TcpStoreServer::Loop::LogRejection(LogLevel level, const std::string& peer,
                                        const std::string& why) {
  rejections_.Reject(level,
                     fmt::format("store {}: closed connection from {}: {}", address_, peer, why));
}

void TcpStoreServer::Loop::RemoveWaiter(Conn& c) {
  if (!c.waiting) return;
  auto range = waiters_.equal_range(c.wait_key);
  for (auto w = range.first; w != range.second; ++w) {
    if (w->second == c.fd.get()) {
      waiters_.erase(w);
      break;
    }
  }
  c.waiting = false;
}

void TcpStoreServer::Loop::ExpireDeadlines() {
  const auto now = Clock::now();
  for (auto& [fd, c] : conns_) {
    if (c->dead) continue;
    if (!c->authed && !c->closing && now >= c->hello_deadline) {
      Reject(*c, fmt::format("no hello within {} ms", options_.hello_timeout.count()));
    } else if (c->waiting && now >= c->wait_deadline) {
      RemoveWaiter(*c);
      SendReply(*c, kReplyDeadline, nullptr, 0);
      ready_.push_back(fd);
    }
  }
}

void TcpStoreServer::Loop::Sweep() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    Conn& c = *it->second;
    if (c.closing && !c.dead && Clock::now() >= c.hello_deadline) c.dead = true;
    if (c.dead) {
      RemoveWaiter(c);
      it = conns_.erase(it);  // closing the fd also removes it from the epoll set
    } else {
      ++it;
    }
  }
}

int TcpStoreServer::Loop::NextTimeoutMs() const {
  // Also wakes when a count of held-back rejection lines is due.
  Clock::time_point next = rejections_.next_flush();
  for (const auto& [fd, c] : conns_) {
    if (!c->authed || c->closing) next = std::min(next, c->hello_deadline);
    if (c->waiting) next = std::min(next, c->wait_deadline);
  }
  if (next == Clock::time_point::max()) return -1;
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count() + 1;
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

}  // namespace kolo::bootstrap
