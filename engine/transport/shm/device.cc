#include "engine/transport/shm/device.h"

#include <poll.h>
#include <sys/epoll.h>

#include "engine/common/logging.h"
#include "engine/transport/paired_device.h"
#include "engine/transport/shm/mesh.h"
#include "engine/transport/shm/pair.h"

namespace kolo::transport::shm {
namespace {

// Bounds on the best-effort farewell frames: a peer that does not read cannot hold us longer.
constexpr std::chrono::milliseconds kAbortBound{1000};
constexpr std::chrono::milliseconds kGoodbyeBound{200};

class ShmDevice final : public PairedDevice<ShmPair> {
 public:
  ShmDevice(int rank, int size, const ShmOptions& options, std::vector<Link> links)
      : PairedDevice(rank, size, options.busy_poll, options.timeout, " on this host") {
    for (int peer = 0; peer < size; ++peer) {
      Link& link = links[static_cast<size_t>(peer)];
      if (!link.socket.valid()) continue;
      AddPair(
          std::make_unique<ShmPair>(state_, peer, std::move(link.socket), std::move(link.segment)));
    }
  }

  ~ShmDevice() override {
    if (closed_) return;
    for (ShmPair* p : pairs()) p->QueueGoodbye();
    CloseAll(kGoodbyeBound);
  }

  Status Init() {
    KOLO_RETURN_IF_ERROR(InitWaitSet());
    for (ShmPair* p : pairs()) {
      // Level-triggered: every readable event is read to the end, and only control frames come
      // this way (a few bytes), never data.
      KOLO_RETURN_IF_ERROR(Watch(p->fd(), EPOLLIN | EPOLLRDHUP, static_cast<uint64_t>(p->peer()),
                                 fmt::format("socket of rank {}", p->peer())));
    }
    return Status::OK();
  }

  const char* name() const override { return "shm"; }
  uint64_t transport_memory_bytes() const override {
    uint64_t n = 0;
    for (const ShmPair* p : pairs()) n += p->segment_bytes();
    return n;
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
    for (ShmPair* p : pairs()) p->QueueAbort(text);
    CloseAll(kAbortBound);
  }

  bool PrepareToSleep(bool for_arrival) override {
    bool sleep = true;
    for (ShmPair* p : pairs()) sleep = p->Arm(for_arrival) && sleep;
    return sleep;
  }

  void AfterSleep() override {
    for (ShmPair* p : pairs()) p->Disarm();
  }

 protected:
  Status Advance() override {
    KOLO_RETURN_IF_ERROR(SendKeepalives());
    for (ShmPair* p : pairs()) KOLO_RETURN_IF_ERROR(p->Progress());
    return Status::OK();
  }

  Status OnEvent(const epoll_event& event) override {
    ShmPair& p = pair_of(static_cast<int>(event.data.u64));
    if (p.fd() < 0) return Status::OK();  // closed by an earlier event of this batch
    return p.OnReadable();
  }

 private:
  // Writes the queued farewell frames on every pair within `bound`, then closes the sockets.
  void CloseAll(std::chrono::milliseconds bound) {
    closed_ = true;
    const auto deadline = Clock::now() + bound;
    std::vector<pollfd> waiting;
    for (;;) {
      waiting.clear();
      for (ShmPair* p : pairs()) {
        if (!p->FlushClosing()) waiting.push_back({p->fd(), POLLOUT, 0});
      }
      if (waiting.empty() || Clock::now() >= deadline) break;
      ::poll(waiting.data(), waiting.size(), RemainingMs(deadline));
    }
    for (ShmPair* p : pairs()) p->Close();
  }

  bool closed_ = false;
};

}  // namespace

StatusOr<std::unique_ptr<PollableDevice>> Connect(const ShmOptions& options,
                                                  bootstrap::Store& store, int rank, int size,
                                                  const std::vector<int>& peers) {
  KOLO_ASSIGN_OR_RETURN(std::vector<Link> links, BuildMesh(options, store, rank, size, peers));
  auto device = std::make_unique<ShmDevice>(rank, size, options, std::move(links));
  KOLO_RETURN_IF_ERROR(device->Init());
  return std::unique_ptr<PollableDevice>(std::move(device));
}

}  // namespace kolo::transport::shm
