#include "engine/transport/tcp/mesh.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <list>

#include "engine/common/logging.h"
#include "engine/transport/poll_core.h"
#include "engine/transport/tcp/handshake.h"

namespace kolo::transport::tcp {
namespace {

// A garbage or silent connection is dropped after this long; it never blocks the real peers,
// which are served concurrently.
constexpr std::chrono::milliseconds kPerConnectionBound{5000};
constexpr std::chrono::milliseconds kRetryMin{5};
constexpr std::chrono::milliseconds kRetryMax{200};

struct Conn {
  enum class State { kConnecting, kAwaitChallenge, kAwaitWelcome, kAwaitHello, kRetryWait };
  State state;
  Fd fd;
  bool outgoing = false;
  int peer = -1;               // known up front for outgoing connections
  int stream = 0;              // outgoing: which of the pair's streams
  sockaddr_in addr{};          // outgoing: where the peer listens
  std::string remote;          // for log lines
  Clock::time_point deadline;  // incoming: per-connection bound; outgoing: next retry
  // Outgoing: when the peer's kernel accepted the connection (the handshake then waits on the
  // peer process itself); max() before that.
  Clock::time_point accepted = Clock::time_point::max();
  std::chrono::milliseconds backoff = kRetryMin;
  std::array<uint8_t, Hello::kBytes> buf{};
  size_t got = 0;
  Nonce acceptor_nonce{};
  Hello hello;  // outgoing: what we sent
};

class MeshBuilder {
 public:
  MeshBuilder(const TcpOptions& options, int rank, int size)
      : options_(options), rank_(rank), size_(size) {
    mesh_.peers.resize(static_cast<size_t>(size));
    streams_ = std::max(1, options.streams);
    // The streams of a pair are the connector's (the higher rank's): ours to lower ranks, and
    // learned from the first hello of each higher rank.
    mesh_.streams.resize(static_cast<size_t>(size));
    pair_streams_.assign(static_cast<size_t>(size), 0);
    for (int r = 0; r < rank; ++r) {
      pair_streams_[static_cast<size_t>(r)] = streams_;
      mesh_.streams[static_cast<size_t>(r)].resize(static_cast<size_t>(streams_ - 1));
    }
    is_peer_.assign(static_cast<size_t>(size), !options.peers.has_value());
    if (options.peers) {
      for (int p : *options.peers) is_peer_[static_cast<size_t>(p)] = true;
    }
    is_peer_[static_cast<size_t>(rank)] = false;
  }

  StatusOr<Mesh> Run(bootstrap::Store& store) {
    deadline_ = Clock::now() + options_.timeout;
    sockaddr_in bound{};
    KOLO_ASSIGN_OR_RETURN(mesh_.listener,
                          Listen(options_.listen_addr, options_.socket_buffer_bytes, &bound));
    const std::string mine = FormatAddress(bound);
    listener_name_ = fmt::format("rank {}: TCP listener {}", rank_, mine);
    mesh_.rejections = std::make_shared<RejectionLog>(listener_name_);
    KOLO_RETURN_IF_ERROR(store.Set(fmt::format("tcp/addr/{}", rank_),
                                   std::vector<uint8_t>(mine.begin(), mine.end())));
    // Lower ranks accept, higher ranks connect.
    for (int peer = 0; peer < rank_; ++peer) {
      if (!is_peer_[static_cast<size_t>(peer)]) continue;
      const std::string key = fmt::format("tcp/addr/{}", peer);
      auto value = store.Get(key, std::chrono::milliseconds(RemainingMs(deadline_)));
      if (!value.ok()) {
        return value.status().WithContext(
            fmt::format("rank {}: looking up the address of rank {}", rank_, peer));
      }
      KOLO_ASSIGN_OR_RETURN(sockaddr_in addr,
                            ParseAddress(std::string(value->begin(), value->end())));
      for (int stream = 0; stream < streams_; ++stream) {
        Conn& c = conns_.emplace_back();
        c.outgoing = true;
        c.peer = peer;
        c.stream = stream;
        c.addr = addr;
        c.remote = FormatAddress(addr);
        KOLO_RETURN_IF_ERROR(StartConnect(c));
      }
    }
    while (!AllConnected()) {
      KOLO_RETURN_IF_ERROR(Step());
    }
    return std::move(mesh_);
  }

 private:
  Status StartConnect(Conn& c) {
    KOLO_ASSIGN_OR_RETURN(c.fd, NewStreamSocket(options_.socket_buffer_bytes));
    c.got = 0;
    c.accepted = Clock::time_point::max();
    if (::connect(c.fd.get(), reinterpret_cast<const sockaddr*>(&c.addr), sizeof c.addr) == 0) {
      c.state = Conn::State::kAwaitChallenge;
      c.accepted = Clock::now();
    } else if (errno == EINPROGRESS) {
      c.state = Conn::State::kConnecting;
    } else {
      ScheduleRetry(c, std::strerror(errno));
    }
    return Status::OK();
  }

  void ScheduleRetry(Conn& c, const char* why) {
    KOLO_LOG(kInfo, "rank {}: connecting to rank {} at {}: {}; retrying in {} ms", rank_, c.peer,
             c.remote, why, c.backoff.count());
    c.fd.reset();
    c.state = Conn::State::kRetryWait;
    c.deadline = Clock::now() + c.backoff;
    c.backoff = std::min(c.backoff * 2, kRetryMax);
  }

  Status Step() {
    std::vector<pollfd> fds;
    std::vector<Conn*> owners;
    fds.push_back({mesh_.listener.get(), POLLIN, 0});
    owners.push_back(nullptr);
    // Also wakes when a count of held-back rejection lines is due.
    Clock::time_point wake = std::min(deadline_, mesh_.rejections->next_flush());
    for (Conn& c : conns_) {
      if (c.state == Conn::State::kRetryWait || c.state == Conn::State::kAwaitHello) {
        wake = std::min(wake, c.deadline);
      }
      if (c.state == Conn::State::kRetryWait) continue;
      fds.push_back({c.fd.get(),
                     static_cast<short>(c.state == Conn::State::kConnecting ? POLLOUT : POLLIN),
                     0});
      owners.push_back(&c);
    }
    const int n = ::poll(fds.data(), fds.size(), RemainingMs(wake));
    if (n < 0 && errno != EINTR) return ErrnoStatus(StatusCode::kInternal, "poll(set-up)", errno);
    for (size_t i = 1; n > 0 && i < fds.size(); ++i) {
      if (fds[i].revents != 0) KOLO_RETURN_IF_ERROR(Advance(*owners[i]));
    }
    if (n > 0 && fds[0].revents != 0) AcceptAll();
    // Drop finished or failed connections, expire silent ones, restart refused connects.
    const auto now = Clock::now();
    mesh_.rejections->Flush(now);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (!it->fd.valid() && it->state != Conn::State::kRetryWait) {
        it = conns_.erase(it);
        continue;
      }
      if (it->state == Conn::State::kAwaitHello && now >= it->deadline) {
        LogRejection(it->remote, fmt::format("no handshake within {} ms", Bound().count()));
        it = conns_.erase(it);
        continue;
      }
      if (it->state == Conn::State::kRetryWait && now >= it->deadline) {
        KOLO_RETURN_IF_ERROR(StartConnect(*it));
      }
      ++it;
    }
    if (now >= deadline_ && !AllConnected()) return TimedOut();
    return Status::OK();
  }

  std::chrono::milliseconds Bound() const {
    return std::min(options_.timeout, kPerConnectionBound);
  }

  Status TimedOut() {
    std::string missing;
    for (int r = 0; r < size_; ++r) {
      if (is_peer_[static_cast<size_t>(r)] && !Connected(r)) {
        missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
      }
    }
    // A peer whose kernel accepted our connection but whose process never answered the handshake
    // is stopped or hung: named as such, apart from peers that simply have not connected yet
    // (they may be waiting on it too).
    std::string silent;
    const auto now = Clock::now();
    for (const Conn& c : conns_) {
      if (c.outgoing && c.accepted != Clock::time_point::max() &&
          (c.state == Conn::State::kAwaitChallenge || c.state == Conn::State::kAwaitWelcome)) {
        silent += fmt::format(
            "; rank {} has sent nothing for {:.1f} s since it accepted our connection (stopped or "
            "hung?)",
            c.peer, std::chrono::duration<double>(now - c.accepted).count());
      }
    }
    return DeadlineExceeded(
        "rank {}: TCP set-up did not finish within {} ms; not connected to rank(s) {} (are they "
        "running, with the same job secret and size {}?){}",
        rank_, options_.timeout.count(), missing, size_, silent);
  }

  void AcceptAll() {
    for (;;) {
      Fd fd(::accept4(mesh_.listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!fd.valid()) {
        // EMFILE and the like leave the connection in the backlog and the listener readable: the
        // next Step tries again, so this line could repeat on every one.
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
          mesh_.rejections->Reject(
              LogLevel::kWarning,
              fmt::format("{}: accept failed: {}", listener_name_,
                          ErrnoStatus(StatusCode::kInternal, "accept4", errno).message()));
        }
        return;
      }
      Conn c;
      c.state = Conn::State::kAwaitHello;
      c.remote = PeerAddress(fd.get());
      c.deadline = Clock::now() + Bound();
      auto nonce = RandomNonce();
      Status s = nonce.ok() ? SetNoDelay(fd.get()) : nonce.status();
      if (s.ok()) {
        c.acceptor_nonce = *nonce;
        Challenge challenge{rank_, c.acceptor_nonce};
        uint8_t wire[Challenge::kBytes];
        Encode(challenge, wire);
        if (::send(fd.get(), wire, sizeof wire, MSG_NOSIGNAL) !=
            static_cast<ssize_t>(sizeof wire)) {
          s = ErrnoStatus(StatusCode::kUnavailable, "send(challenge)", errno);
        }
      }
      if (!s.ok()) {
        LogRejection(c.remote, s.ToString());
        continue;
      }
      c.fd = std::move(fd);
      conns_.push_back(std::move(c));
    }
  }

  // Reads toward `want` bytes. Returns true once they are all there; false if more must come.
  // EOF or a socket error is reported in *closed.
  bool ReadSome(Conn& c, size_t want, bool* closed) {
    *closed = false;
    while (c.got < want) {
      const ssize_t n = ::recv(c.fd.get(), c.buf.data() + c.got, want - c.got, 0);
      if (n > 0) {
        c.got += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        *closed = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
        return false;
      }
    }
    return true;
  }

  void Reject(Conn& c, const std::string& why) {
    LogRejection(c.remote, why);
    c.fd.reset();
  }

  // Every turned-away connection is logged through here: a few lines per 10 s, the rest counted.
  void LogRejection(const std::string& remote, const std::string& why) {
    mesh_.rejections->Reject(LogLevel::kWarning, fmt::format("{}: rejected connection from {}: {}",
                                                             listener_name_, remote, why));
  }

  Status Advance(Conn& c) {
    bool closed = false;
    switch (c.state) {
      case Conn::State::kConnecting: {
        int err = 0;
        socklen_t len = sizeof err;
        if (::getsockopt(c.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        if (err == 0) {
          c.state = Conn::State::kAwaitChallenge;
          c.accepted = Clock::now();
        } else {
          ScheduleRetry(c, std::strerror(err));  // e.g. the peer's backlog is full
        }
        return Status::OK();
      }
      case Conn::State::kAwaitChallenge: {
        if (!ReadSome(c, Challenge::kBytes, &closed)) {
          // E.g. the acceptor dropped us as too slow.
          if (closed) ScheduleRetry(c, "closed before the challenge");
          return Status::OK();
        }
        Challenge challenge;
        Status s = Decode(c.buf.data(), &challenge);
        if (!s.ok()) {
          return s.WithContext(
              fmt::format("rank {}: connecting to rank {} at {}", rank_, c.peer, c.remote));
        }
        if (challenge.acceptor_rank != c.peer) {
          return ProtocolError("rank {}: the address {} published for rank {} is served by rank {}",
                               rank_, c.remote, c.peer, challenge.acceptor_rank);
        }
        c.acceptor_nonce = challenge.nonce;
        KOLO_ASSIGN_OR_RETURN(c.hello.nonce, RandomNonce());
        c.hello.from_rank = rank_;
        c.hello.to_rank = c.peer;
        c.hello.size = size_;
        c.hello.stream = c.stream;
        c.hello.streams = streams_;
        c.hello.mac = ConnectorProof(options_.secret, c.acceptor_nonce, c.hello);
        uint8_t wire[Hello::kBytes];
        Encode(c.hello, wire);
        if (::send(c.fd.get(), wire, sizeof wire, MSG_NOSIGNAL) !=
            static_cast<ssize_t>(sizeof wire)) {
          ScheduleRetry(c, "could not send the hello");
          return Status::OK();
        }
        c.got = 0;
        c.state = Conn::State::kAwaitWelcome;
        return Status::OK();
      }
      case Conn::State::kAwaitWelcome: {
        if (!ReadSome(c, Welcome::kBytes, &closed)) {
          if (closed) {
            return Unavailable(
                "rank {}: rank {} at {} closed the connection during the handshake: it rejected "
                "our proof of the job secret or our rank/size (do all ranks share the same job "
                "secret and size {}?)",
                rank_, c.peer, c.remote, size_);
          }
          return Status::OK();
        }
        Welcome welcome;
        Status s = Decode(c.buf.data(), &welcome);
        if (!s.ok()) {
          return s.WithContext(fmt::format("rank {}: handshake with rank {}", rank_, c.peer));
        }
        if (!DigestsEqual(welcome.mac, AcceptorProof(options_.secret, c.acceptor_nonce, c.hello))) {
          return Unavailable("rank {}: rank {} at {} failed to prove the job secret", rank_, c.peer,
                             c.remote);
        }
        Establish(c, c.peer, c.stream);
        return Status::OK();
      }
      case Conn::State::kAwaitHello: {
        if (!ReadSome(c, Hello::kBytes, &closed)) {
          if (closed) Reject(c, "closed before completing the handshake");
          return Status::OK();
        }
        Hello hello;
        Status s = Decode(c.buf.data(), &hello);
        if (!s.ok()) {
          Reject(c, s.message());
        } else if (hello.to_rank != rank_ || hello.size != size_) {
          Reject(c, fmt::format("it wants rank {} of a job of {} ranks; this is rank {} of {}",
                                hello.to_rank, hello.size, rank_, size_));
        } else if (hello.from_rank <= rank_ || hello.from_rank >= size_ ||
                   !is_peer_[static_cast<size_t>(hello.from_rank)]) {
          Reject(c, fmt::format("claimed rank {} is not one that connects to rank {} (allowed: "
                                "{}..{}{})",
                                hello.from_rank, rank_, rank_ + 1, size_ - 1,
                                options_.peers ? ", ranks on other hosts" : ""));
        } else if (!DigestsEqual(hello.mac,
                                 ConnectorProof(options_.secret, c.acceptor_nonce, hello))) {
          Reject(c, fmt::format("claimed rank {} but failed to prove the job secret",
                                hello.from_rank));
        } else if (hello.streams < 1 || hello.streams > kMaxStreams || hello.stream < 0 ||
                   hello.stream >= hello.streams) {
          Reject(c, fmt::format("claimed rank {} with stream {} of {} (allowed: 1 to {} streams)",
                                hello.from_rank, hello.stream, hello.streams, kMaxStreams));
        } else if (pair_streams_[static_cast<size_t>(hello.from_rank)] != 0 &&
                   pair_streams_[static_cast<size_t>(hello.from_rank)] != hello.streams) {
          Reject(c, fmt::format("claimed rank {} with {} streams, where its other connections "
                                "said {}",
                                hello.from_rank, hello.streams,
                                pair_streams_[static_cast<size_t>(hello.from_rank)]));
        } else if (StreamTaken(hello.from_rank, hello.streams, hello.stream)) {
          Reject(c,
                 fmt::format("rank {} is already connected{}", hello.from_rank,
                             hello.streams > 1 ? fmt::format(" on stream {}", hello.stream) : ""));
        } else {
          Welcome welcome{AcceptorProof(options_.secret, c.acceptor_nonce, hello)};
          uint8_t wire[Welcome::kBytes];
          Encode(welcome, wire);
          if (::send(c.fd.get(), wire, sizeof wire, MSG_NOSIGNAL) !=
              static_cast<ssize_t>(sizeof wire)) {
            Reject(c, fmt::format("claimed rank {} but could not be answered", hello.from_rank));
          } else {
            Establish(c, hello.from_rank, hello.stream);
          }
        }
        return Status::OK();
      }
      case Conn::State::kRetryWait:
        return Status::OK();
    }
    return Status::OK();
  }

  // The connection to `peer` on `stream`.
  Fd& Slot(int peer, int stream) {
    if (stream == 0) return mesh_.peers[static_cast<size_t>(peer)];
    return mesh_.streams[static_cast<size_t>(peer)][static_cast<size_t>(stream - 1)];
  }

  // Every stream to `peer` is connected (a higher peer's count is known from its first hello).
  bool Connected(int peer) {
    const int k_max = pair_streams_[static_cast<size_t>(peer)];
    if (k_max == 0) return false;
    for (int k = 0; k < k_max; ++k) {
      if (!Slot(peer, k).valid()) return false;
    }
    return true;
  }

  bool AllConnected() {
    for (int r = 0; r < size_; ++r) {
      if (is_peer_[static_cast<size_t>(r)] && !Connected(r)) return false;
    }
    return true;
  }

  // An authenticated hello from a higher `peer` for `stream` of `streams`: the pair's count is
  // learned from the first; whether that stream is connected already.
  bool StreamTaken(int peer, int streams, int stream) {
    if (pair_streams_[static_cast<size_t>(peer)] == 0) {
      pair_streams_[static_cast<size_t>(peer)] = streams;
      mesh_.streams[static_cast<size_t>(peer)].resize(static_cast<size_t>(streams - 1));
    }
    return Slot(peer, stream).valid();
  }

  void Establish(Conn& c, int peer, int stream) {
    KOLO_LOG(kDebug, "rank {}: connected to rank {} ({}, stream {})", rank_, peer, c.remote,
             stream);
    Slot(peer, stream) = std::move(c.fd);
  }

  const TcpOptions& options_;
  const int rank_;
  const int size_;
  Clock::time_point deadline_;
  Mesh mesh_;
  std::list<Conn> conns_;          // stable addresses while Step() holds pointers
  std::vector<bool> is_peer_;      // the ranks to connect to
  int streams_ = 1;                // connections this rank opens to each lower peer
  std::vector<int> pair_streams_;  // each peer's pair's streams; 0 while not yet known
  std::string listener_name_;      // "rank 0: TCP listener 127.0.0.1:4242", for log lines
};

}  // namespace

StatusOr<Mesh> BuildMesh(const TcpOptions& options, bootstrap::Store& store, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgument("rank {} of size {}: need size >= 1 and 0 <= rank < size", rank, size);
  }
  if (options.peers) {
    for (int p : *options.peers) {
      if (p < 0 || p >= size || p == rank) {
        return InvalidArgument("rank {} of size {}: {} is not a peer", rank, size, p);
      }
    }
  }
  MeshBuilder builder(options, rank, size);
  return builder.Run(store);
}

}  // namespace kolo::transport::tcp
