#include "engine/transport/shm/host_area.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <sstream>

#include "engine/common/crypto.h"
#include "engine/common/random.h"

namespace kolo::transport::shm {
namespace {

constexpr uint64_t kHostAreaMagic = 0x31414853544f484bull;  // "KHOSTSA1"
constexpr uint32_t kHostAreaVersion = 1;
constexpr size_t kPage = 4096;
// Banks are cache-line multiples; a slot of more than this is refused (the area is mapped by
// every rank of the host).
constexpr size_t kMaxSlotBytes = 4 << 20;
constexpr int kMaxRanks = 4096;

struct HostAreaHeader {
  uint64_t magic = 0;
  uint32_t version = 0;
  int32_t ranks = 0;
  uint64_t slot_bytes = 0;
  uint64_t total_bytes = 0;
  SegmentNonce nonce{};
};
static_assert(sizeof(HostAreaHeader) <= kPage);

size_t ControlBytes(int size) {
  const size_t b = static_cast<size_t>(size) * sizeof(HostSlotControl);
  return (b + kPage - 1) / kPage * kPage;
}

constexpr const char* kWhat = "the host-wide shared-memory area";

StatusOr<void*> Map(int fd, size_t bytes) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    return ErrnoStatus(StatusCode::kUnavailable, fmt::format("mmap of {} ({} bytes)", kWhat, bytes),
                       errno);
  }
  return base;
}

// "pid fd nonce-hex": where the others find rank 0's area; "unavailable <reason>" when rank 0
// could not make it.
std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace

size_t HostAreaBytes(int size, size_t slot_bytes) {
  return kPage + ControlBytes(size) + static_cast<size_t>(size) * 2 * slot_bytes;
}

HostArea::~HostArea() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

HostSlotControl& HostArea::control(int r) const {
  return *reinterpret_cast<HostSlotControl*>(static_cast<uint8_t*>(base_) + kPage +
                                             static_cast<size_t>(r) * sizeof(HostSlotControl));
}

uint8_t* HostArea::slot(int r, int bank) const {
  return static_cast<uint8_t*>(base_) + kPage + ControlBytes(size_) +
         (static_cast<size_t>(r) * 2 + static_cast<size_t>(bank)) * slot_bytes_;
}

StatusOr<std::unique_ptr<HostArea>> HostArea::Attach(bootstrap::Store& store,
                                                     const std::string& key,
                                                     const std::string& job_id, int rank, int size,
                                                     size_t slot_bytes,
                                                     std::chrono::milliseconds timeout) {
  if (size < 1 || size > kMaxRanks || rank < 0 || rank >= size) {
    return InvalidArgument("{}: rank {} of {} is outside [0, {})", kWhat, rank, size, kMaxRanks);
  }
  if (slot_bytes < 64 || slot_bytes > kMaxSlotBytes || slot_bytes % 64 != 0) {
    return InvalidArgument("{}: slot of {} bytes; allowed: a multiple of 64 from 64 to {} MiB",
                           kWhat, slot_bytes, kMaxSlotBytes >> 20);
  }
  const size_t bytes = HostAreaBytes(size, slot_bytes);
  if (rank == 0) {
    // Every failure is announced, so that the others fail at once with its reason.
    auto fail = [&](Status s) {
      store.Set(key, Bytes("unavailable " + s.message())).IgnoreError();
      return s;
    };
    SegmentNonce nonce;
    if (!FillRandom(nonce.data(), nonce.size())) {
      return fail(Internal("no kernel randomness for the nonce of {}", kWhat));
    }
    const std::string label = fmt::format("kolo-{}-host", job_id);
    tcp::Fd fd(MemoryFile(label));
    if (!fd.valid()) {
      return fail(
          ErrnoStatus(StatusCode::kUnavailable, fmt::format("memfd_create({})", label), errno));
    }
    if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
      return fail(ErrnoStatus(StatusCode::kUnavailable,
                              fmt::format("ftruncate of {} to {} bytes", kWhat, bytes), errno));
    }
    const int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes));
    if (err != 0) {
      return fail(
          Unavailable("cannot reserve {} bytes for {} ({})", bytes, kWhat, std::strerror(err)));
    }
    if (::fcntl(fd.get(), F_ADD_SEALS, kSizeSeals) != 0) {
      return fail(
          ErrnoStatus(StatusCode::kInternal, fmt::format("sealing the size of {}", kWhat), errno));
    }
    auto base = Map(fd.get(), bytes);
    if (!base.ok()) return fail(base.status());
    std::unique_ptr<HostArea> area(new HostArea(*base, bytes, rank, size, slot_bytes));
    auto* h = new (*base) HostAreaHeader;
    h->version = kHostAreaVersion;
    h->ranks = size;
    h->slot_bytes = slot_bytes;
    h->total_bytes = bytes;
    h->nonce = nonce;
    for (int r = 0; r < size; ++r) new (&area->control(r)) HostSlotControl;
    std::atomic_thread_fence(std::memory_order_release);
    h->magic = kHostAreaMagic;
    area->descriptor_ = std::move(fd);
    KOLO_RETURN_IF_ERROR(
        store.Set(key, Bytes(fmt::format("{} {} {}", ::getpid(), area->descriptor_.get(),
                                         Hex(nonce.data(), nonce.size())))));
    return area;
  }

  KOLO_ASSIGN_OR_RETURN(const std::vector<uint8_t> value, store.Get(key, timeout));
  const std::string text(value.begin(), value.end());
  if (text.rfind("unavailable ", 0) == 0) {
    return Unavailable("rank 0 could not make {}: {}", kWhat, text.substr(12));
  }
  std::istringstream in(text);
  long pid = 0;
  int remote_fd = -1;
  std::string nonce_hex;
  std::string nonce_bytes;
  in >> pid >> remote_fd >> nonce_hex;
  if (in.fail() || pid <= 0 || remote_fd < 0 || !FromHex(nonce_hex, &nonce_bytes) ||
      nonce_bytes.size() != sizeof(SegmentNonce)) {
    return Unavailable("{}: rank 0's announcement '{}' is not '<pid> <fd> <nonce>'", kWhat, text);
  }
  const std::string path = fmt::format("/proc/{}/fd/{}", pid, remote_fd);
  tcp::Fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) {
    return ErrnoStatus(StatusCode::kUnavailable,
                       fmt::format("opening {} of rank 0 as {} (are the ranks in one process "
                                   "namespace, as one user?)",
                                   kWhat, path),
                       errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return ErrnoStatus(StatusCode::kInternal, fmt::format("fstat of {} ({})", kWhat, path), errno);
  }
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
      static_cast<uint64_t>(st.st_size) != bytes) {
    return Unavailable(
        "refusing {} at {}: file type {:o}, owner uid {}, {} bytes; expected a regular file of "
        "uid {} of {} bytes",
        kWhat, path, st.st_mode & S_IFMT, st.st_uid, st.st_size, ::geteuid(), bytes);
  }
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & kSizeSeals) != kSizeSeals) {
    return Unavailable("refusing {} at {}: not a memory file sealed against any change of its size",
                       kWhat, path);
  }
  KOLO_ASSIGN_OR_RETURN(void* base, Map(fd.get(), bytes));
  fd.reset();  // the mapping keeps the memory
  std::unique_ptr<HostArea> area(new HostArea(base, bytes, rank, size, slot_bytes));
  const auto* h = static_cast<const HostAreaHeader*>(base);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (h->magic != kHostAreaMagic || h->version != kHostAreaVersion || h->ranks != size ||
      h->slot_bytes != slot_bytes || h->total_bytes != bytes ||
      std::memcmp(h->nonce.data(), nonce_bytes.data(), nonce_bytes.size()) != 0) {
    return Unavailable(
        "refusing {} at {}: its header (magic {:#x}, {} ranks, slots of {} bytes) is not the one "
        "rank 0 announced (a foreign file)",
        kWhat, path, h->magic, h->ranks, h->slot_bytes);
  }
  return area;
}

}  // namespace kolo::transport::shm
