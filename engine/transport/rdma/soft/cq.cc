#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "engine/transport/rdma/soft/fabric.h"
#include "engine/transport/rdma/soft/ops.h"

namespace kolo::transport::rdma::soft::ops {

namespace {

// Resets the channel's eventfd once its last event was taken (the counter is non-zero, so the read
// does not block even on a blocking fd).
void Drain(Channel* ch) {
  uint64_t value = 0;
  [[maybe_unused]] ssize_t n = ::read(ch->base.fd, &value, sizeof value);
}

}  // namespace

ibv_comp_channel* CreateCompChannel(ibv_context* context) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Context* c = f.FindContext(context);
  if (c == nullptr) return Fail<ibv_comp_channel>(EINVAL);
  int fd = ::eventfd(0, EFD_CLOEXEC);
  if (fd < 0) return nullptr;  // errno from eventfd
  auto* ch = new Channel();
  ch->ctx = c;
  ch->base.context = context;
  ch->base.fd = fd;
  f.channels[&ch->base] = ch;
  return &ch->base;
}

int DestroyCompChannel(ibv_comp_channel* channel) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Channel* ch = f.FindChannel(channel);
  if (ch == nullptr) return EINVAL;
  for (auto& [p, cq] : f.cqs) {
    if (cq->channel == ch) return EBUSY;
  }
  ::close(ch->base.fd);
  f.channels.erase(channel);
  delete ch;
  return 0;
}

ibv_cq* CreateCq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                 int comp_vector) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Context* c = f.FindContext(context);
  if (c == nullptr || cqe < 1 || cqe > kMaxCqe || comp_vector < 0 ||
      comp_vector >= c->base.num_comp_vectors) {
    return Fail<ibv_cq>(EINVAL);
  }
  Channel* ch = nullptr;
  if (channel != nullptr) {
    ch = f.FindChannel(channel);
    if (ch == nullptr || ch->ctx != c) return Fail<ibv_cq>(EINVAL);
  }
  auto* cq = new Cq();
  cq->ctx = c;
  cq->channel = ch;
  cq->capacity = cqe;
  cq->base.context = context;
  cq->base.channel = channel;
  cq->base.cq_context = cq_context;
  cq->base.cqe = cqe;
  cq->base.handle = f.next_key++;
  pthread_mutex_init(&cq->base.mutex, nullptr);
  pthread_cond_init(&cq->base.cond, nullptr);
  f.cqs[&cq->base] = cq;
  return &cq->base;
}

int DestroyCq(ibv_cq* cq) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Cq* c = f.FindCq(cq);
  if (c == nullptr) return EINVAL;
  for (auto& [p, qp] : f.qps) {
    if (qp->send_cq == c || qp->recv_cq == c) return EBUSY;
  }
  // libibverbs waits in ibv_destroy_cq for the events it handed out to be acknowledged; a wait
  // that could never end is reported instead.
  if (c->events_got != c->events_acked) return EBUSY;
  if (Channel* ch = c->channel) {
    bool had = !ch->events.empty();
    ch->events.erase(std::remove(ch->events.begin(), ch->events.end(), c), ch->events.end());
    if (had && ch->events.empty()) Drain(ch);
  }
  pthread_cond_destroy(&c->base.cond);
  pthread_mutex_destroy(&c->base.mutex);
  f.cqs.erase(cq);
  delete c;
  return 0;
}

int ReqNotifyCq(ibv_cq* cq, int solicited_only) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Cq* c = f.FindCq(cq);
  if (c == nullptr) return EINVAL;
  c->armed = true;
  c->solicited_only = solicited_only != 0;
  return 0;
}

int GetCqEvent(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  Fabric& f = Fabric::Get();
  while (true) {
    int fd = -1;
    {
      MutexLock lock(f.mu);
      Channel* ch = f.FindChannel(channel);
      if (ch == nullptr || cq == nullptr || cq_context == nullptr) {
        errno = EINVAL;
        return -1;
      }
      if (!ch->events.empty()) {
        Cq* c = ch->events.front();
        ch->events.pop_front();
        if (ch->events.empty()) Drain(ch);
        ++c->events_got;
        *cq = &c->base;
        *cq_context = c->base.cq_context;
        return 0;
      }
      fd = ch->base.fd;
    }
    int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0) return -1;
    if (flags & O_NONBLOCK) {
      errno = EAGAIN;
      return -1;
    }
    // Blocks as libibverbs' read of the event file does; callers that need a bound make the fd
    // non-blocking and poll it with their timeout.
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, -1) < 0 && errno != EINTR) return -1;
  }
}

void AckCqEvents(ibv_cq* cq, unsigned int nevents) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  if (Cq* c = f.FindCq(cq)) c->events_acked += nevents;
}

int PollCq(ibv_cq* cq, int num_entries, ibv_wc* wc) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Cq* c = f.FindCq(cq);
  if (c == nullptr || num_entries < 0 || (num_entries > 0 && wc == nullptr)) return -EINVAL;
  int n = 0;
  while (n < num_entries && !c->entries.empty()) {
    wc[n++] = c->entries.front();
    c->entries.pop_front();
  }
  // A CQ that overflowed lost completions: once what it kept is read, polling reports the error.
  if (n == 0 && c->overflowed) return -EOVERFLOW;
  return n;
}

}  // namespace kolo::transport::rdma::soft::ops
