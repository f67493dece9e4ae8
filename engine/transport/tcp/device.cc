#include "engine/transport/tcp/device.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "engine/common/logging.h"
#include "engine/transport/paired_device.h"
#include "engine/transport/tcp/mesh.h"
#include "engine/transport/tcp/pair.h"

namespace kolo::transport::tcp {
namespace {

// Bounds on the best-effort farewell frames: a peer that does not read cannot hold us longer.
constexpr std::chrono::milliseconds kAbortBound{1000};
constexpr std::chrono::milliseconds kGoodbyeBound{200};

class TcpDevice final : public PairedDevice<TcpPair, TcpState> {
 public:
  TcpDevice(int rank, int size, const TcpOptions& options, Mesh mesh)
      : PairedDevice(rank, size, options.busy_poll, options.timeout),
        socket_buffer_bytes_(
            static_cast<uint64_t>(std::max<int64_t>(options.socket_buffer_bytes, 0))),
        flow_cap_(options.flow_cap_bytes_per_s),
        listener_(std::move(mesh.listener)),
        rejections_(std::move(mesh.rejections)) {
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank || !mesh.peers[static_cast<size_t>(peer)].valid()) continue;
      AddPair(std::make_unique<TcpPair>(
          state_, peer, std::move(mesh.peers[static_cast<size_t>(peer)]),
          std::move(mesh.streams[static_cast<size_t>(peer)]), options.stripe_min_bytes));
    }
  }

  ~TcpDevice() override {
    if (closed_) return;
    for (TcpPair* p : pairs()) p->QueueGoodbye();
    CloseAll(kGoodbyeBound);
  }

  Status Init() {
    KOLO_RETURN_IF_ERROR(InitWaitSet());
    KOLO_RETURN_IF_ERROR(Watch(listener_.get(), EPOLLIN, kListenerId, "listener"));
    for (TcpPair* p : pairs()) {
      // Edge-triggered: a pair keeps its own readable/writable flags, so back-pressure (not
      // reading) costs no epoll_ctl calls and no wake-ups.
      KOLO_RETURN_IF_ERROR(Watch(p->fd(), EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
                                 static_cast<uint64_t>(p->peer()),
                                 fmt::format("connection to rank {}", p->peer())));
      // Streams 1..: id (k << 32) | peer.
      for (int k = 1; k < p->streams(); ++k) {
        KOLO_RETURN_IF_ERROR(
            Watch(p->stream_fd(k), EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
                  (static_cast<uint64_t>(k) << 32) | static_cast<uint64_t>(p->peer()),
                  fmt::format("stream {} to rank {}", k, p->peer())));
      }
      // The emulated cluster's per-flow cap: every connection paced (labelled emulation).
      if (flow_cap_ > 0) KOLO_RETURN_IF_ERROR(p->CapEachStream(flow_cap_));
    }
    return Status::OK();
  }

  const char* name() const override { return "tcp"; }
  // What the sockets' buffers may hold: a send and a receive buffer per connection, as asked.
  uint64_t transport_memory_bytes() const override {
    uint64_t connections = 0;
    for (const TcpPair* p : pairs()) connections += static_cast<uint64_t>(p->streams());
    return 2 * socket_buffer_bytes_ * connections;
  }

  StatusOr<std::unique_ptr<Region>> Register(void* data, size_t size) override {
    if (data == nullptr && size > 0) {
      return InvalidArgument("Register: null pointer with size {} (only size 0 may be null)", size);
    }
    return std::make_unique<Region>(data, size);
  }

  void Abort(const Status& reason) override {
    if (closed_) return;
    state_.Fail(Aborted("rank {} aborted: {}", state_.rank, reason.ToString())).IgnoreError();
    const std::string text = reason.ToString();
    for (TcpPair* p : pairs()) p->QueueAbort(text);
    CloseAll(kAbortBound);
  }

  // Edge-triggered sockets: an edge not yet taken keeps the epoll set readable, and bytes taken
  // are processed at once; nothing to arrange.
  bool PrepareToSleep(bool /*for_arrival*/) override { return true; }
  void AfterSleep() override {}

 protected:
  Status Advance() override {
    rejections_->Flush();  // a count of held-back rejection lines, when one is due
    return SendKeepalives();
  }

  // Late connections, or progress on a pair (an error is recorded as the device's).
  Status OnEvent(const epoll_event& event) override {
    if (event.data.u64 == kListenerId) {
      RejectLateConnections();
      return Status::OK();
    }
    const int peer = static_cast<int>(event.data.u64 & 0xffffffffu);
    const int stream = static_cast<int>(event.data.u64 >> 32);
    TcpPair& pair = pair_of(peer);
    Status s =
        stream == 0 ? pair.OnEvents(event.events) : pair.OnStreamEvents(stream, event.events);
    if (!s.ok()) return state_.Fail(s);
    return Status::OK();
  }

 private:
  // Every peer is connected at set-up; whoever connects later is turned away, and logged through
  // the listener's RejectionLog (a few lines per 10 s however many come).
  void RejectLateConnections() {
    for (;;) {
      Fd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!fd.valid()) return;
      rejections_->Reject(LogLevel::kWarning,
                          fmt::format("{}: rejected connection from {}: every peer is already "
                                      "connected",
                                      rejections_->prefix(), PeerAddress(fd.get())));
    }
  }

  // Writes the queued farewell frames on every pair within `bound`, then closes everything.
  void CloseAll(std::chrono::milliseconds bound) {
    closed_ = true;
    const auto deadline = Clock::now() + bound;
    std::vector<pollfd> waiting;
    for (;;) {
      waiting.clear();
      for (TcpPair* p : pairs()) {
        if (!p->FlushClosing()) waiting.push_back({p->fd(), POLLOUT, 0});
      }
      if (waiting.empty() || Clock::now() >= deadline) break;
      ::poll(waiting.data(), waiting.size(), RemainingMs(deadline));
    }
    DrainUntilPeersClose(deadline);
    for (TcpPair* p : pairs()) p->Close();
    listener_.reset();
  }

  // Closing a socket whose receive queue holds unread bytes sends a reset, and a reset makes the
  // peer's kernel drop what it has not yet read — our farewell frame among it. So: half-close,
  // then read and discard until each peer closes its side (peers close promptly once they have
  // read the farewell) or the deadline passes.
  void DrainUntilPeersClose(Clock::time_point deadline) {
    std::vector<pollfd> open;
    for (TcpPair* p : pairs()) {
      if (p->fd() < 0) continue;  // already closed: nothing to wait for
      ::shutdown(p->fd(), SHUT_WR);
      open.push_back({p->fd(), POLLIN, 0});
    }
    char sink[64 * 1024];
    while (!open.empty() && Clock::now() < deadline) {
      if (::poll(open.data(), open.size(), RemainingMs(deadline)) <= 0) break;
      for (size_t i = 0; i < open.size();) {
        bool done = false;
        if (open[i].revents & (POLLIN | POLLHUP | POLLERR)) {
          const ssize_t n = ::recv(open[i].fd, sink, sizeof sink, MSG_DONTWAIT);
          done = n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
        }
        if (done) {
          open[i] = open.back();
          open.pop_back();
        } else {
          open[i].revents = 0;
          ++i;
        }
      }
    }
  }

  static constexpr uint64_t kListenerId = kWakeId - 1;  // the pairs' ids are their ranks

  const uint64_t socket_buffer_bytes_;
  const double flow_cap_;  // bytes/s per connection, 0: none (the emulated cluster's cap)
  Fd listener_;
  std::shared_ptr<RejectionLog> rejections_;  // the listener's, from set-up
  bool closed_ = false;
};

}  // namespace

StatusOr<std::unique_ptr<PollableDevice>> Connect(const TcpOptions& options,
                                                  bootstrap::Store& store, int rank, int size) {
  if (options.streams < 1 || options.streams > kMaxStreams) {
    return InvalidArgument("{} TCP streams per peer: allowed are 1 to {}", options.streams,
                           kMaxStreams);
  }
  KOLO_ASSIGN_OR_RETURN(Mesh mesh, BuildMesh(options, store, rank, size));
  auto device = std::make_unique<TcpDevice>(rank, size, options, std::move(mesh));
  KOLO_RETURN_IF_ERROR(device->Init());
  return std::unique_ptr<PollableDevice>(std::move(device));
}

}  // namespace kolo::transport::tcp
