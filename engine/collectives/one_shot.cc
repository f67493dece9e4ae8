// The one-shot allreduce through a host-wide shared-memory area (transport/shm/host_area.h): each
// rank copies its input into its slot and says so; once every rank has, each sums every slot in
// rank order into its buffer. One step, whatever the rank count: no message, no partner to wait
// for but the last to arrive. A buffer larger than a slot goes in slot-sized pieces, each a call.
//
// Calls alternate between the two banks of each slot, so that call k + 1 is written while slower
// ranks still read call k; before writing call k into a bank a rank waits until every rank has
// finished reading call k - 2 from it. Waits spin briefly (yielding) and then sleep on the
// control word (a futex in the shared mapping); the writer wakes sleepers only when there are any.
// Every wait is bounded by comm.timeout and names the ranks it waits for; while asleep it looks at
// the device every few milliseconds, so that a peer whose connection is lost is named at once.
//
// The sum is formed in rank order on every rank: every rank ends with the same bits.
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <optional>

#include "engine/collectives/collectives.h"
#include "engine/collectives/pipeline.h"
#include "engine/common/logging.h"
#include "engine/kernels/reduce.h"
#include "engine/transport/shm/host_area.h"

namespace kolo::collectives {
namespace {

using transport::shm::HostArea;
using transport::shm::HostSlotControl;
using Clock = std::chrono::steady_clock;

constexpr const char* kWhat = "one-shot allreduce (host-wide shared memory)";
// A sleeper looks at the device (lost peers) and the deadline this often.
constexpr auto kSleepSlice = std::chrono::milliseconds(5);

bool Reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

void FutexWake(std::atomic<uint32_t>& word) {
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
}

void FutexWait(std::atomic<uint32_t>& word, uint32_t seen, std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000),
              static_cast<long>(timeout.count() % 1000000000)};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void Publish(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers, uint32_t value) {
  word.store(value, std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_seq_cst) != 0) FutexWake(word);
}

// Waits until every rank in [0, size) but this one has `field` at `target` or beyond. `doing`
// says what the ranks waited for did ("published its input of", "finished reading").
Status AwaitAll(Comm& comm, HostArea& area, std::atomic<uint32_t> HostSlotControl::*field,
                std::atomic<uint32_t> HostSlotControl::*sleepers, uint32_t target,
                const char* doing, const char* what = kWhat) {
  // The clock is read only once some rank has not arrived yet (the common case reads none).
  std::optional<Clock::time_point> deadline;
  for (int r = 0; r < area.size(); ++r) {
    if (r == area.rank()) continue;
    HostSlotControl& c = area.control(r);
    std::atomic<uint32_t>& word = c.*field;
    if (Reached(word.load(std::memory_order_acquire), target)) continue;
    if (!deadline) deadline = Clock::now() + comm.timeout;
    const Clock::time_point spin_until = Clock::now() + area.spin;
    while (!Reached(word.load(std::memory_order_acquire), target) && Clock::now() < spin_until) {
      ::sched_yield();
    }
    while (!Reached(word.load(std::memory_order_acquire), target)) {
      const Clock::time_point now = Clock::now();
      if (now >= *deadline) {
        std::vector<int> missing;
        for (int m = 0; m < area.size(); ++m) {
          if (m != area.rank() && !Reached((area.control(m).*field).load(), target)) {
            missing.push_back(m);
          }
        }
        return DeadlineExceeded("rank {}: {}: rank{} {} {} not {} call {} after {} s", comm.rank(),
                                what, missing.size() == 1 ? "" : "s", fmt::join(missing, ", "),
                                missing.size() == 1 ? "has" : "have", doing, target,
                                std::chrono::duration<double>(comm.timeout).count());
      }
      std::atomic<uint32_t>& asleep = c.*sleepers;
      asleep.fetch_add(1, std::memory_order_seq_cst);
      const uint32_t seen = word.load(std::memory_order_seq_cst);
      if (!Reached(seen, target))
        FutexWait(word, seen, std::min<Clock::duration>(kSleepSlice, *deadline - now));
      asleep.fetch_sub(1, std::memory_order_seq_cst);
      if (!Reached(word.load(std::memory_order_acquire), target) && comm.device != nullptr) {
        // A peer whose process died is named by its connection rather than by the deadline.
        bool arrived = false;
        Status s = comm.device->WaitForArrival(std::chrono::microseconds(0), &arrived);
        if (!s.ok()) return s.WithContext(fmt::format("rank {}: {}", comm.rank(), what));
      }
    }
  }
  return Status::OK();
}

// A virtual buffer: the concatenation of spans.
struct BufferPart {
  uint8_t* data;
  size_t nbytes;
};

// Calls fn(span pointer, bytes, offset within [begin, end)) for the parts of the virtual buffer
// `spans` in [begin, end).
template <typename Fn>
void ForEachPart(const std::vector<BufferPart>& spans, size_t begin, size_t end, Fn fn) {
  size_t at = 0;
  for (const BufferPart& s : spans) {
    const size_t lo = std::max(at, begin);
    const size_t hi = std::min(at + s.nbytes, end);
    if (lo < hi) fn(s.data + (lo - at), hi - lo, lo - begin);
    at += s.nbytes;
    if (at >= end) break;
  }
}

// Bumps the doorbell of `c`'s rank, and wakes its engine thread where it sleeps on it.
void Ring(HostSlotControl& c) {
  c.doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (c.doorbell_sleepers.load(std::memory_order_seq_cst) != 0) FutexWake(c.doorbell);
}

// One call through `area`: waits until this rank's bank for the call is free (every rank done
// reading the call before last), lets write(slot) fill this rank's slot and return its bytes,
// publishes, rings the peers idle on their doorbells that have not entered (an exchange they must
// join), waits for every rank's input, lets read(bank, call) use the bank, then publishes that this
// rank has read it. `what` names the collective in errors.
template <typename Write, typename Read>
Status Step(Comm& comm, HostArea& area, const char* what, Write write, Read read) {
  const int me = area.rank();
  HostSlotControl& mine = area.control(me);
  const uint64_t call = ++area.calls;
  const auto k = static_cast<uint32_t>(call);  // as the control words carry it
  const int bank = static_cast<int>(k & 1);
  // The bank held call k - 2: every rank must be done reading it.
  if (call > 2) {
    KOLO_RETURN_IF_ERROR(AwaitAll(comm, area, &HostSlotControl::consumed,
                                  &HostSlotControl::consumed_sleepers, k - 2, "finished reading",
                                  what));
  }
  const size_t bytes = write(area.slot(me, bank));
  mine.bytes[bank] = bytes;
  Publish(mine.published, mine.published_sleepers, k);
  for (int r = 0; r < area.size(); ++r) {
    if (r == me) continue;
    HostSlotControl& c = area.control(r);
    if (!Reached(c.published.load(std::memory_order_seq_cst), k) &&
        c.doorbell_sleepers.load(std::memory_order_seq_cst) != 0) {
      Ring(c);
    }
  }
  KOLO_RETURN_IF_ERROR(AwaitAll(comm, area, &HostSlotControl::published,
                                &HostSlotControl::published_sleepers, k, "published its input of",
                                what));
  KOLO_RETURN_IF_ERROR(read(bank, k));
  Publish(mine.consumed, mine.consumed_sleepers, k);
  area.bytes_written += bytes;
  area.bytes_read += static_cast<uint64_t>(area.size() - 1) * bytes;
  return Status::OK();
}

// Through `area`, whose members are this host's ranks (every rank of the communicator, or one
// host's of several): every member ends with the sum over the members.
Status OneShot(Comm& comm, HostArea& area, const std::vector<BufferPart>& spans, size_t total_bytes,
               DataType dtype) {
  const size_t elem = DataTypeSize(dtype);
  const size_t piece = area.slot_bytes() / elem * elem;
  size_t begin = 0;
  do {
    const size_t end = std::min(total_bytes, begin + piece);
    const size_t len = end - begin;
    auto write = [&](uint8_t* slot) {
      ForEachPart(spans, begin, end,
                  [&](uint8_t* p, size_t n, size_t at) { std::memcpy(slot + at, p, n); });
      return len;
    };
    auto read = [&](int bank, uint32_t k) -> Status {
      for (int r = 0; r < area.size(); ++r) {
        if (area.control(r).bytes[bank] != len) {
          return ProtocolError(
              "rank {}: {} call {}: rank {} put in {} bytes, this rank {} (the ranks ran "
              "different collectives)",
              comm.rank(), kWhat, k, r, area.control(r).bytes[bank], len);
        }
      }
      // out = slot 0 + slot 1 + ... in rank order, the same on every rank.
      ForEachPart(spans, begin, end, [&](uint8_t* p, size_t n, size_t at) {
        const size_t count = n / elem;
        if (area.size() == 1) {
          std::memcpy(p, area.slot(0, bank) + at, n);
          return;
        }
        kernels::ReduceSum3(dtype, p, area.slot(0, bank) + at, area.slot(1, bank) + at, count);
        for (int r = 2; r < area.size(); ++r) {
          kernels::ReduceSum(dtype, p, area.slot(r, bank) + at, count);
        }
      });
      return Status::OK();
    };
    KOLO_RETURN_IF_ERROR(Step(comm, area, kWhat, write, read));
    begin = end;
  } while (begin < total_bytes);
  return Status::OK();
}

// Whether some peer has published a call this rank has not reached (calls + 1 or beyond): an idle
// rank's peer entered an exchange.
bool PeerAhead(const HostArea& area) {
  const auto next = static_cast<uint32_t>(area.calls + 1);
  for (int r = 0; r < area.size(); ++r) {
    if (r != area.rank() &&
        Reached(area.control(r).published.load(std::memory_order_seq_cst), next)) {
      return true;
    }
  }
  return false;
}

// The extents as parts of one virtual buffer; InvalidArgument for one outside its region.
StatusOr<std::vector<BufferPart>> PartsOf(const std::vector<Extent>& extents) {
  std::vector<BufferPart> parts;
  parts.reserve(extents.size());
  for (const Extent& e : extents) {
    if (e.region == nullptr || e.offset > e.region->size() ||
        e.nbytes > e.region->size() - e.offset) {
      return InvalidArgument("{}: an extent lies outside its buffer", kWhat);
    }
    parts.push_back(BufferPart{e.region->data() + e.offset, e.nbytes});
  }
  return parts;
}

Status CheckUsable(const Comm& comm) {
  if (comm.host_area == nullptr) {
    return FailedPrecondition(
        "{} needs every rank on one host with a host-wide shared-memory area (transport auto or "
        "shm); this communicator has none",
        kWhat);
  }
  const HostArea& area = *comm.host_area;
  if (area.size() != comm.size() || area.rank() != comm.rank()) {
    return FailedPrecondition(
        "rank {}: {}: the area holds rank {} of {}, the communicator rank {} of {}", comm.rank(),
        kWhat, area.rank(), area.size(), comm.rank(), comm.size());
  }
  return Status::OK();
}

}  // namespace

Status OneShotAllreduce(Comm& comm, transport::Region& buf, size_t offset_bytes, size_t count,
                        DataType dtype) {
  KOLO_RETURN_IF_ERROR(CheckUsable(comm));
  const size_t bytes = count * DataTypeSize(dtype);
  if (offset_bytes > buf.size() || count > (buf.size() - offset_bytes) / DataTypeSize(dtype)) {
    return InvalidArgument("{}: {} {} elements at byte {} exceed the {}-byte buffer", kWhat, count,
                           DataTypeName(dtype), offset_bytes, buf.size());
  }
  ++comm.sequence;
  PhaseScope phase(comm, Phase::kOneShot);
  return OneShot(comm, *comm.host_area, {BufferPart{buf.data() + offset_bytes, bytes}}, bytes,
                 dtype);
}

Status OneShotAllreduce(Comm& comm, const std::vector<Extent>& extents, DataType dtype) {
  KOLO_RETURN_IF_ERROR(CheckUsable(comm));
  KOLO_ASSIGN_OR_RETURN(const std::vector<BufferPart> spans, PartsOf(extents));
  size_t total = 0;
  for (const BufferPart& p : spans) total += p.nbytes;
  ++comm.sequence;
  PhaseScope phase(comm, Phase::kOneShot);
  return OneShot(comm, *comm.host_area, spans, total, dtype);
}

bool BitExchangeThroughHostArea(const Comm& comm, size_t max_bytes) {
  const HostArea* area = comm.host_area;
  return area != nullptr && comm.device != nullptr && area->size() == comm.size() &&
         area->rank() == comm.rank() && comm.size() > 1 && max_bytes <= area->slot_bytes();
}

Status HostAreaBitwiseAllreduce(Comm& comm, transport::Region& buf, size_t and_words,
                                size_t or_words, size_t payload_bytes, DataType dtype, uint8_t* sum,
                                bool* summed) {
  static constexpr const char* kExchange = "bit exchange (host-wide shared memory)";
  HostArea& area = *comm.host_area;
  const size_t word_bytes = (and_words + or_words) * sizeof(uint64_t);
  const size_t bytes = word_bytes + payload_bytes;
  if (bytes > area.slot_bytes() || buf.size() < bytes) {
    return InvalidArgument("rank {}: {}: {} bytes do not fit a {}-byte slot or the {}-byte buffer",
                           comm.rank(), kExchange, bytes, area.slot_bytes(), buf.size());
  }
  auto* words = reinterpret_cast<uint64_t*>(buf.data());
  auto write = [&](uint8_t* slot) {
    std::memcpy(slot, buf.data(), bytes);
    return bytes;
  };
  auto read = [&](int bank, uint32_t k) -> Status {
    bool all_carried = payload_bytes > 0;
    for (int r = 0; r < area.size(); ++r) {
      const uint64_t theirs = area.control(r).bytes[bank];
      if (theirs < word_bytes) {
        return ProtocolError(
            "rank {}: {} call {}: rank {} put in {} bytes, fewer than the {} bytes of words (the "
            "ranks ran different collectives)",
            comm.rank(), kExchange, k, r, theirs, word_bytes);
      }
      if (theirs != bytes) all_carried = false;
      if (r == area.rank()) continue;
      const auto* w = reinterpret_cast<const uint64_t*>(area.slot(r, bank));
      kernels::BitAnd(words, w, and_words);
      kernels::BitOr(words + and_words, w + and_words, or_words);
    }
    if (all_carried) {
      // In rank order on every rank: every rank ends with the same bits.
      const size_t count = payload_bytes / DataTypeSize(dtype);
      std::memcpy(sum, area.slot(0, bank) + word_bytes, payload_bytes);
      for (int r = 1; r < area.size(); ++r) {
        kernels::ReduceSum(dtype, sum, area.slot(r, bank) + word_bytes, count);
      }
      *summed = true;
    }
    return Status::OK();
  };
  return Step(comm, area, kExchange, write, read);
}

void RingHostDoorbell(HostArea* area) {
  if (area != nullptr) Ring(area->control(area->rank()));
}

uint32_t HostDoorbell(const HostArea& area) {
  return area.control(area.rank()).doorbell.load(std::memory_order_seq_cst);
}

Status AwaitHostDoorbell(Comm& comm, uint32_t rung, Clock::time_point until, bool* peer_ahead) {
  *peer_ahead = false;
  HostArea& area = *comm.host_area;
  HostSlotControl& mine = area.control(area.rank());
  auto look = [&]() -> Status {
    // The device: a lost peer, a message that arrived, the keepalives that are due.
    bool arrived = false;
    KOLO_RETURN_IF_ERROR(comm.device->WaitForArrival(std::chrono::microseconds(0), &arrived));
    *peer_ahead = arrived || PeerAhead(area);
    return Status::OK();
  };
  KOLO_RETURN_IF_ERROR(look());
  const Clock::time_point spin_until = std::min(until, Clock::now() + area.spin);
  while (!*peer_ahead && mine.doorbell.load(std::memory_order_acquire) == rung &&
         Clock::now() < spin_until) {
    ::sched_yield();
    *peer_ahead = PeerAhead(area);
  }
  while (!*peer_ahead && mine.doorbell.load(std::memory_order_acquire) == rung) {
    const Clock::time_point now = Clock::now();
    if (now >= until) break;
    mine.doorbell_sleepers.fetch_add(1, std::memory_order_seq_cst);
    // After announcing the sleeper: a peer that published before this look is seen here; one
    // that publishes after sees the sleeper and rings.
    if (!PeerAhead(area)) {
      FutexWait(mine.doorbell, rung, std::min<Clock::duration>(kSleepSlice, until - now));
    }
    mine.doorbell_sleepers.fetch_sub(1, std::memory_order_seq_cst);
    KOLO_RETURN_IF_ERROR(look());
  }
  return Status::OK();
}

StatusOr<bool> AllRanksTrue(Comm& comm, bool mine, Scratch& scratch) {
  if (comm.device == nullptr || comm.size() == 1) return mine;
  uint64_t word = mine ? 1 : 0;
  KOLO_ASSIGN_OR_RETURN(std::unique_ptr<transport::Region> region,
                        comm.device->Register(&word, sizeof word));
  KOLO_RETURN_IF_ERROR(BitwiseAllreduce(comm, *region, 1, 0, scratch));
  return word == 1;
}

StatusOr<std::unique_ptr<HostArea>> AttachHostArea(Comm& comm, bootstrap::Store& store,
                                                   const std::string& key,
                                                   const std::string& secret,
                                                   std::chrono::microseconds spin,
                                                   Scratch& scratch) {
  std::vector<int> everyone(static_cast<size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) everyone[static_cast<size_t>(r)] = r;
  return AttachHostArea(comm, everyone, store, key, secret, spin, scratch);
}

StatusOr<std::unique_ptr<HostArea>> AttachHostArea(Comm& comm, const std::vector<int>& local,
                                                   bootstrap::Store& store, const std::string& key,
                                                   const std::string& secret,
                                                   std::chrono::microseconds spin,
                                                   Scratch& scratch) {
  const auto me = std::find(local.begin(), local.end(), comm.rank());
  if (me == local.end()) {
    return InvalidArgument("rank {}: the host-wide area's ranks do not hold this rank",
                           comm.rank());
  }
  auto area = HostArea::Attach(store, key, transport::shm::JobId(secret),
                               static_cast<int>(me - local.begin()), static_cast<int>(local.size()),
                               HostArea::kDefaultSlotBytes,
                               std::chrono::duration_cast<std::chrono::milliseconds>(comm.timeout));
  if (!area.ok()) {
    KOLO_LOG(kWarning, "rank {}: no host-wide shared-memory area, so no one-shot allreduce: {}",
             comm.rank(), area.status().ToString());
  }
  KOLO_ASSIGN_OR_RETURN(const bool everywhere, AllRanksTrue(comm, area.ok(), scratch));
  if (!everywhere) {
    if (area.ok()) {
      KOLO_LOG(kInfo,
               "rank {}: not every rank could map the host-wide shared-memory area: no "
               "one-shot allreduce",
               comm.rank());
    }
    return std::unique_ptr<HostArea>();
  }
  (*area)->CloseDescriptor();
  (*area)->spin = spin;
  return std::move(area).value();
}

Status HierarchicalSmallAllreduce(Comm& comm, const HostGroups& groups, transport::Region& buf,
                                  size_t offset_bytes, size_t count, DataType dtype,
                                  Scratch& scratch) {
  if (groups.area == nullptr) {
    return FailedPrecondition(
        "rank {}: hierarchical allreduce of small buffers needs its host's shared-memory area, "
        "which this rank has not",
        comm.rank());
  }
  const size_t bytes = count * DataTypeSize(dtype);
  if (offset_bytes > buf.size() || count > (buf.size() - offset_bytes) / DataTypeSize(dtype)) {
    return InvalidArgument(
        "hierarchical allreduce: {} {} elements at byte {} exceed the {}-byte "
        "buffer",
        count, DataTypeName(dtype), offset_bytes, buf.size());
  }
  PhaseScope phase(comm, Phase::kHierarchical);
  {
    PhaseScope one_shot(comm, Phase::kOneShot);
    KOLO_RETURN_IF_ERROR(
        OneShot(comm, *groups.area, {BufferPart{buf.data() + offset_bytes, bytes}}, bytes, dtype));
  }
  return RecursiveDoublingAllreduce(comm, groups.cross, buf, offset_bytes, count, dtype, scratch);
}

Status HierarchicalSmallAllreduce(Comm& comm, const HostGroups& groups,
                                  const std::vector<Extent>& extents, DataType dtype,
                                  Scratch& scratch) {
  if (groups.area == nullptr) {
    return FailedPrecondition(
        "rank {}: hierarchical allreduce of small buffers needs its host's shared-memory area, "
        "which this rank has not",
        comm.rank());
  }
  KOLO_ASSIGN_OR_RETURN(const std::vector<BufferPart> parts, PartsOf(extents));
  size_t bytes = 0;
  for (const BufferPart& p : parts) bytes += p.nbytes;
  PhaseScope phase(comm, Phase::kHierarchical);
  {
    PhaseScope one_shot(comm, Phase::kOneShot);
    KOLO_RETURN_IF_ERROR(OneShot(comm, *groups.area, parts, bytes, dtype));
  }
  // Across hosts the extents are staged through scratch, as recursive doubling does for them.
  return RecursiveDoublingAllreduce(comm, groups.cross, extents, dtype, scratch);
}

}  // namespace kolo::collectives
