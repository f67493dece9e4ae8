#include "engine/transport/shm/mesh.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <thread>

#include "engine/common/crypto.h"
#include "engine/common/logging.h"
#include "engine/common/random.h"
#include "engine/transport/poll_core.h"
#include "engine/transport/tcp/handshake.h"

namespace kolo::transport::shm {
namespace {

using tcp::Fd;

// A garbage or silent connection is dropped after this long.
constexpr std::chrono::milliseconds kPerConnectionBound{5000};
constexpr std::chrono::milliseconds kRetryMin{2};
constexpr std::chrono::milliseconds kRetryMax{100};

// After the handshake the acceptor offers the segment: the nonce (16 bytes) and the ring size
// (8 bytes), in one sendmsg that passes the segment's descriptor with its first byte (SCM_RIGHTS);
// the connector answers with one status byte (0: mapped) and, when it could not map it, a 2-byte
// length and its reason.
constexpr uint8_t kMapped = 0;
constexpr uint8_t kRefused = 1;
constexpr size_t kOfferBytes = sizeof(SegmentNonce) + sizeof(uint64_t);
// Room for this many descriptors in one message's control data: an offer carries one, and more
// than fit would be dropped by the kernel unseen (MSG_CTRUNC), so the room shows extra ones.
constexpr size_t kMaxDescriptors = 8;

socklen_t AbstractAddress(const std::string& name, sockaddr_un* addr) {
  *addr = sockaddr_un{};
  addr->sun_family = AF_UNIX;
  addr->sun_path[0] = '\0';
  std::memcpy(addr->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

StatusOr<Fd> UnixSocket() {
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus(StatusCode::kInternal, "socket(AF_UNIX)", errno);
  return fd;
}

// Blocking exchanges on a non-blocking socket, each bounded by `until`.
Status ReadExact(int fd, void* buf, size_t n, Clock::time_point until, const char* what) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t got = 0;
  while (got < n) {
    const ssize_t k = ::recv(fd, p + got, n - got, 0);
    if (k > 0) {
      got += static_cast<size_t>(k);
      continue;
    }
    if (k == 0) return Unavailable("the connection closed before the {}", what);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return ErrnoStatus(StatusCode::kUnavailable, fmt::format("reading the {}", what), errno);
    }
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, RemainingMs(until)) == 0) {
      return DeadlineExceeded("no {} within the set-up bound", what);
    }
  }
  return Status::OK();
}

Status WriteAll(int fd, const void* buf, size_t n, Clock::time_point until, const char* what) {
  const auto* p = static_cast<const uint8_t*>(buf);
  size_t done = 0;
  while (done < n) {
    const ssize_t k = ::send(fd, p + done, n - done, MSG_NOSIGNAL);
    if (k > 0) {
      done += static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return ErrnoStatus(StatusCode::kUnavailable, fmt::format("sending the {}", what), errno);
    }
    pollfd pfd{fd, POLLOUT, 0};
    if (::poll(&pfd, 1, RemainingMs(until)) == 0) {
      return DeadlineExceeded("could not send the {} within the set-up bound", what);
    }
  }
  return Status::OK();
}

// Sends the `n` bytes of the segment offer with `descriptor` passed on their first byte
// (SCM_RIGHTS), bounded by `until`. The offer is a few bytes and goes in one sendmsg; were it ever
// cut short, the rest would follow without the descriptor (the kernel attaches it to the bytes of
// the call that carried it).
Status SendWithDescriptor(int fd, const void* buf, size_t n, int descriptor,
                          Clock::time_point until) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{const_cast<void*>(buf), n};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &descriptor, sizeof(int));
  for (;;) {
    const ssize_t k = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (k > 0) {
      const auto sent = static_cast<size_t>(k);
      return WriteAll(fd, static_cast<const uint8_t*>(buf) + sent, n - sent, until,
                      "segment offer");
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return ErrnoStatus(StatusCode::kUnavailable,
                         "sending the segment offer with its descriptor (sendmsg, SCM_RIGHTS)",
                         errno);
    }
    pollfd pfd{fd, POLLOUT, 0};
    if (::poll(&pfd, 1, RemainingMs(until)) == 0) {
      return DeadlineExceeded("could not send the segment offer within the set-up bound");
    }
  }
}

// Reads the `n` bytes of rank `peer`'s segment offer like ReadExact, with recvmsg, and takes the
// one descriptor that must come with their first byte (close-on-exec at once: MSG_CMSG_CLOEXEC).
// No descriptor, more than one, one with a later byte, or more than the control buffer holds
// (MSG_CTRUNC: the kernel dropped the rest) is kProtocol; every descriptor that came is closed.
Status ReadWithDescriptor(int fd, void* buf, size_t n, Clock::time_point until, int peer,
                          Fd* descriptor) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t got = 0;
  while (got < n) {
    alignas(cmsghdr) char control[CMSG_SPACE(kMaxDescriptors * sizeof(int))];
    iovec iov{p + got, n - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t k = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    // Owned before anything else is looked at, so that every way out closes them.
    std::vector<Fd> arrived;
    if (k > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int d;
          std::memcpy(&d, CMSG_DATA(c) + i * sizeof(int), sizeof d);
          arrived.emplace_back(d);
        }
      }
      if ((msg.msg_flags & MSG_CTRUNC) != 0) {
        return ProtocolError(
            "rank {}'s segment offer came with more descriptors than the {} this rank takes "
            "(MSG_CTRUNC), or this process has no descriptor left for it (RLIMIT_NOFILE)",
            peer, kMaxDescriptors);
      }
      if (got == 0 && arrived.size() != 1) {
        return ProtocolError("rank {}'s segment offer came with {} descriptors, expected one", peer,
                             arrived.size());
      }
      if (got > 0 && !arrived.empty()) {
        return ProtocolError(
            "rank {}'s segment offer came with {} more descriptor(s) after its first byte", peer,
            arrived.size());
      }
      if (got == 0) *descriptor = std::move(arrived.front());
      got += static_cast<size_t>(k);
      continue;
    }
    if (k == 0) return Unavailable("the connection closed before the segment offer");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return ErrnoStatus(StatusCode::kUnavailable, "reading the segment offer (recvmsg)", errno);
    }
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, RemainingMs(until)) == 0) {
      return DeadlineExceeded("no segment offer within the set-up bound");
    }
  }
  return Status::OK();
}

// The user the other end of a connected AF_UNIX socket runs as must be this process's: only its
// own user's processes may talk to a rank (and the segments are that user's files).
Status CheckPeerUser(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "getsockopt(SO_PEERCRED)", errno);
  }
  if (cred.uid != ::geteuid()) {
    return Unavailable("the process at the other end (pid {}) runs as uid {}, this rank as uid {}",
                       cred.pid, cred.uid, ::geteuid());
  }
  return Status::OK();
}

void Put16(std::string* out, size_t v) {
  out->push_back(static_cast<char>(v & 0xff));
  out->push_back(static_cast<char>((v >> 8) & 0xff));
}

class MeshBuilder {
 public:
  MeshBuilder(const ShmOptions& options, int rank, int size, const std::vector<int>& peers)
      : options_(options), rank_(rank), size_(size), job_(JobId(options.secret)) {
    links_.resize(static_cast<size_t>(size));
    is_peer_.assign(static_cast<size_t>(size), false);
    for (int p : peers) is_peer_[static_cast<size_t>(p)] = true;
  }

  StatusOr<std::vector<Link>> Run(bootstrap::Store& store) {
    deadline_ = Clock::now() + options_.timeout;
    int higher = 0;
    for (int p = 0; p < size_; ++p) higher += is_peer_[static_cast<size_t>(p)] && p > rank_;
    Fd listener;
    if (higher > 0) {
      KOLO_ASSIGN_OR_RETURN(listener, Listen(store));
    }
    // Lower ranks accept and make the segments; higher ranks connect. A rank connects to all its
    // lower peers before it accepts, and the lowest only accepts, so nobody waits in a circle.
    for (int p = 0; p < rank_; ++p) {
      if (!is_peer_[static_cast<size_t>(p)]) continue;
      Status s = ConnectTo(store, p);
      if (!s.ok()) {
        return s.WithContext(fmt::format("rank {}: shared-memory set-up with rank {}", rank_, p));
      }
    }
    while (connected_higher_ < higher) {
      KOLO_RETURN_IF_ERROR(AcceptOne(listener.get()));
    }
    return std::move(links_);
  }

 private:
  StatusOr<Fd> Listen(bootstrap::Store& store) {
    uint8_t suffix[8];
    if (!FillRandom(suffix, sizeof suffix)) {
      return Internal("no kernel randomness for the shared-memory listener's name");
    }
    const std::string name =
        fmt::format("kolo-shm-{}-{}-{}", job_, rank_, Hex(suffix, sizeof suffix));
    KOLO_ASSIGN_OR_RETURN(Fd fd, UnixSocket());
    sockaddr_un addr;
    const socklen_t len = AbstractAddress(name, &addr);
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
      return ErrnoStatus(StatusCode::kUnavailable, fmt::format("bind(@{})", name), errno);
    }
    if (::listen(fd.get(), 128) != 0) {
      return ErrnoStatus(StatusCode::kUnavailable, "listen(AF_UNIX)", errno);
    }
    const std::string published = "@" + name;
    KOLO_RETURN_IF_ERROR(store.Set(fmt::format("shm/addr/{}", rank_),
                                   std::vector<uint8_t>(published.begin(), published.end())));
    return fd;
  }

  Status ConnectTo(bootstrap::Store& store, int peer) {
    auto value = store.Get(fmt::format("shm/addr/{}", peer),
                           std::chrono::milliseconds(RemainingMs(deadline_)));
    if (!value.ok()) return value.status().WithContext("looking up its socket");
    const std::string published(value->begin(), value->end());
    if (!IsListenerName(published, job_, peer)) {
      return ProtocolError("rank {} published '{}', not a shared-memory socket of this job", peer,
                           published);
    }
    sockaddr_un addr;
    const socklen_t len = AbstractAddress(published.substr(1), &addr);
    Fd fd;
    std::chrono::milliseconds backoff = kRetryMin;
    for (;;) {
      KOLO_ASSIGN_OR_RETURN(fd, UnixSocket());
      if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), len) == 0) break;
      const int err = errno;
      // EAGAIN: the listener's backlog is full, worth another try. Anything else (nothing listens
      // under the name: the peer has gone, or it is in another network namespace) will not mend:
      // the name was published after the listener was bound.
      if ((err != EAGAIN && err != EINTR) || Clock::now() + backoff >= deadline_) {
        return ErrnoStatus(StatusCode::kUnavailable, fmt::format("connect({})", published), err)
            .WithContext(fmt::format(
                "rank {} published its shared-memory socket but cannot be reached there (ranks "
                "that share a host name must share a network namespace: give each "
                "host its own KOLO_HOST_NAME, or use --transport tcp)",
                peer));
      }
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, kRetryMax);
    }
    KOLO_RETURN_IF_ERROR(CheckPeerUser(fd.get()));
    const int s = fd.get();
    uint8_t challenge_wire[tcp::Challenge::kBytes];
    const auto connected = Clock::now();
    if (Status r = ReadExact(s, challenge_wire, sizeof challenge_wire, deadline_,
                             "challenge (is the rank running, with the same job secret?)");
        !r.ok()) {
      if (r.code() != StatusCode::kDeadlineExceeded) return r;
      // Its socket took the connection (the kernel does that for a stopped process too), but the
      // rank never answered: named as the silent one, apart from ranks merely not connected yet.
      return DeadlineExceeded(
          "rank {} has sent nothing for {:.1f} s since it accepted our connection (stopped or "
          "hung?)",
          peer, std::chrono::duration<double>(Clock::now() - connected).count());
    }
    tcp::Challenge challenge;
    KOLO_RETURN_IF_ERROR(tcp::Decode(challenge_wire, &challenge));
    if (challenge.acceptor_rank != peer) {
      return ProtocolError("the socket {} published for rank {} is served by rank {}", published,
                           peer, challenge.acceptor_rank);
    }
    tcp::Hello hello;
    KOLO_ASSIGN_OR_RETURN(hello.nonce, tcp::RandomNonce());
    hello.from_rank = rank_;
    hello.to_rank = peer;
    hello.size = size_;
    hello.mac = tcp::ConnectorProof(options_.secret, challenge.nonce, hello);
    uint8_t hello_wire[tcp::Hello::kBytes];
    tcp::Encode(hello, hello_wire);
    KOLO_RETURN_IF_ERROR(WriteAll(s, hello_wire, sizeof hello_wire, deadline_, "hello"));
    uint8_t welcome_wire[tcp::Welcome::kBytes];
    Status got = ReadExact(s, welcome_wire, sizeof welcome_wire, deadline_, "welcome");
    if (!got.ok()) {
      return Unavailable(
          "rank {} closed the connection during the handshake: it rejected our proof of the job "
          "secret or our rank/size (do all ranks share the same job secret and size {}?): {}",
          peer, size_, got.message());
    }
    tcp::Welcome welcome;
    KOLO_RETURN_IF_ERROR(tcp::Decode(welcome_wire, &welcome));
    if (!DigestsEqual(welcome.mac, tcp::AcceptorProof(options_.secret, challenge.nonce, hello))) {
      return Unavailable("rank {} failed to prove the job secret", peer);
    }
    // The segment offer, and the segment's descriptor with its first byte.
    auto take_offer = [&]() -> StatusOr<Segment> {
      uint8_t offer[kOfferBytes];
      Fd descriptor;
      KOLO_RETURN_IF_ERROR(
          ReadWithDescriptor(s, offer, sizeof offer, deadline_, peer, &descriptor));
      SegmentNonce nonce;
      uint64_t ring_bytes = 0;
      std::memcpy(nonce.data(), offer, nonce.size());
      std::memcpy(&ring_bytes, offer + nonce.size(), sizeof ring_bytes);
      return Segment::Open(std::move(descriptor), peer, rank_, ring_bytes, nonce);
    };
    StatusOr<Segment> segment = take_offer();
    if (!segment.ok()) {
      // Tell the creator why, so that it fails with the reason instead of a lost connection.
      std::string refusal(1, static_cast<char>(kRefused));
      const std::string why = segment.status().ToString().substr(0, 1000);
      Put16(&refusal, why.size());
      refusal += why;
      WriteAll(s, refusal.data(), refusal.size(), deadline_, "refusal").IgnoreError();
      return segment.status();
    }
    const uint8_t mapped = kMapped;
    KOLO_RETURN_IF_ERROR(WriteAll(s, &mapped, 1, deadline_, "segment answer"));
    const uint64_t ring_bytes = segment->ring_bytes();
    links_[static_cast<size_t>(peer)] = Link{std::move(fd), std::move(segment).value()};
    KOLO_LOG(kDebug, "rank {}: shared memory with rank {} ({} bytes per direction)", rank_, peer,
             ring_bytes);
    return Status::OK();
  }

  // The ring size of the pair with `peer` (this rank creates its segment).
  uint64_t RingBytesFor(int peer) const {
    if (!options_.full_ring_peers) return options_.ring_bytes;
    const auto& full = *options_.full_ring_peers;
    if (std::find(full.begin(), full.end(), peer) != full.end()) return options_.ring_bytes;
    return std::min<uint64_t>(options_.ring_bytes, ShmOptions::kSmallRingBytes);
  }

  void Reject(const std::string& who, const std::string& why) {
    rejections_.Reject(LogLevel::kWarning, fmt::format("{}: rejected connection from {}: {}",
                                                       rejections_.prefix(), who, why));
  }

  // Waits for one connection and serves it. Errors of an authenticated peer fail the set-up;
  // anything else is rejected (logged) and set-up goes on.
  Status AcceptOne(int listener) {
    pollfd pfd{listener, POLLIN, 0};
    // Also wakes when a count of held-back rejection lines is due.
    const int n = ::poll(&pfd, 1, RemainingMs(std::min(deadline_, rejections_.next_flush())));
    if (n < 0 && errno != EINTR) {
      return ErrnoStatus(StatusCode::kInternal, "poll(shared-memory listener)", errno);
    }
    rejections_.Flush();
    if (n <= 0) {
      if (Clock::now() < deadline_) return Status::OK();
      return TimedOut();
    }
    Fd fd(::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) return Status::OK();
    if (Status s = CheckPeerUser(fd.get()); !s.ok()) {
      Reject("another user", s.message());
      return Status::OK();
    }
    const int s = fd.get();
    const auto bound = std::min(deadline_, Clock::now() + kPerConnectionBound);
    tcp::Challenge challenge{rank_, {}};
    KOLO_ASSIGN_OR_RETURN(challenge.nonce, tcp::RandomNonce());
    uint8_t challenge_wire[tcp::Challenge::kBytes];
    tcp::Encode(challenge, challenge_wire);
    if (Status w = WriteAll(s, challenge_wire, sizeof challenge_wire, bound, "challenge");
        !w.ok()) {
      Reject("a local process", w.message());
      return Status::OK();
    }
    uint8_t hello_wire[tcp::Hello::kBytes];
    if (Status r = ReadExact(s, hello_wire, sizeof hello_wire, bound, "hello"); !r.ok()) {
      Reject("a local process", r.message());
      return Status::OK();
    }
    tcp::Hello hello;
    if (Status d = tcp::Decode(hello_wire, &hello); !d.ok()) {
      Reject("a local process", d.message());
      return Status::OK();
    }
    const int from = hello.from_rank;
    if (hello.to_rank != rank_ || hello.size != size_) {
      Reject("a local process", fmt::format("it wants rank {} of a job of {} ranks; this is rank "
                                            "{} of {}",
                                            hello.to_rank, hello.size, rank_, size_));
      return Status::OK();
    }
    if (from <= rank_ || from >= size_ || !is_peer_[static_cast<size_t>(from)]) {
      Reject("a local process",
             fmt::format("claimed rank {} is not one that connects to rank {} here", from, rank_));
      return Status::OK();
    }
    if (!DigestsEqual(hello.mac, tcp::ConnectorProof(options_.secret, challenge.nonce, hello))) {
      Reject("a local process",
             fmt::format("claimed rank {} but failed to prove the job secret", from));
      return Status::OK();
    }
    if (links_[static_cast<size_t>(from)].socket.valid()) {
      Reject("a local process", fmt::format("rank {} is already connected", from));
      return Status::OK();
    }
    // Authenticated: from here on a failure is the job's.
    auto fail = [&](const Status& e) {
      return e.WithContext(fmt::format("rank {}: shared-memory set-up with rank {}", rank_, from));
    };
    tcp::Welcome welcome{tcp::AcceptorProof(options_.secret, challenge.nonce, hello)};
    uint8_t welcome_wire[tcp::Welcome::kBytes];
    tcp::Encode(welcome, welcome_wire);
    const uint64_t ring_bytes = RingBytesFor(from);
    Fd descriptor;
    auto segment = Segment::Create(job_, rank_, from, ring_bytes, &descriptor);
    if (!segment.ok()) return fail(segment.status());
    uint8_t offer[kOfferBytes];
    std::memcpy(offer, segment->nonce().data(), segment->nonce().size());
    std::memcpy(offer + segment->nonce().size(), &ring_bytes, sizeof ring_bytes);
    // The Welcome on its own, then the offer: the descriptor rides on the offer's first byte, which
    // the connector reads with recvmsg once it has checked the Welcome (a plain recv of the bytes
    // that carry a descriptor would make the kernel drop it).
    Status st = WriteAll(s, welcome_wire, sizeof welcome_wire, deadline_, "welcome");
    if (st.ok()) st = SendWithDescriptor(s, offer, sizeof offer, descriptor.get(), deadline_);
    // In flight, the socket holds the file; mapped, the mapping does. Ours is no longer needed.
    descriptor.reset();
    uint8_t answer = kRefused;
    if (st.ok()) st = ReadExact(s, &answer, 1, deadline_, "answer to the segment offer");
    if (!st.ok()) return fail(st);
    if (answer != kMapped) {
      uint8_t len_wire[2] = {0, 0};
      std::string why;
      if (ReadExact(s, len_wire, 2, bound, "refusal").ok()) {
        why.resize(len_wire[0] | (size_t{len_wire[1]} << 8));
        if (!ReadExact(s, why.data(), why.size(), bound, "refusal").ok()) why.clear();
      }
      return fail(Unavailable("rank {} could not map the shared-memory segment: {}", from,
                              why.empty() ? "no reason given" : why));
    }
    links_[static_cast<size_t>(from)] = Link{std::move(fd), std::move(segment).value()};
    ++connected_higher_;
    return Status::OK();
  }

  Status TimedOut() const {
    std::string missing;
    for (int r = 0; r < size_; ++r) {
      if (r != rank_ && is_peer_[static_cast<size_t>(r)] &&
          !links_[static_cast<size_t>(r)].socket.valid()) {
        missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
      }
    }
    return DeadlineExceeded(
        "rank {}: shared-memory set-up did not finish within {} ms; not connected to rank(s) {} "
        "(are they running, with the same job secret and size {}?)",
        rank_, options_.timeout.count(), missing, size_);
  }

  const ShmOptions& options_;
  const int rank_;
  const int size_;
  const std::string job_;
  std::vector<bool> is_peer_;
  Clock::time_point deadline_;
  std::vector<Link> links_;
  int connected_higher_ = 0;
  // Every way the listener turns a connection away, a few lines per 10 s and then a count.
  RejectionLog rejections_{fmt::format("rank {}: shared-memory listener", rank_)};
};

}  // namespace

bool IsListenerName(const std::string& published, const std::string& job_id, int rank) {
  const std::string prefix = fmt::format("@kolo-shm-{}-{}-", job_id, rank);
  if (published.size() != prefix.size() + 16 || published.compare(0, prefix.size(), prefix) != 0) {
    return false;
  }
  for (size_t i = prefix.size(); i < published.size(); ++i) {
    const char c = published[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

StatusOr<std::vector<Link>> BuildMesh(const ShmOptions& options, bootstrap::Store& store, int rank,
                                      int size, const std::vector<int>& peers) {
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgument("rank {} of size {}: need size >= 1 and 0 <= rank < size", rank, size);
  }
  for (int p : peers) {
    if (p < 0 || p >= size || p == rank) {
      return InvalidArgument("rank {} of size {}: {} is not a peer", rank, size, p);
    }
  }
  KOLO_RETURN_IF_ERROR(CheckRingBytes(options.ring_bytes));
  MeshBuilder builder(options, rank, size, peers);
  return builder.Run(store);
}

}  // namespace kolo::transport::shm
