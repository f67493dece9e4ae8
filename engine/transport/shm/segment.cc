#include "engine/transport/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <utility>

#include "engine/common/crypto.h"
#include "engine/common/random.h"

namespace kolo::transport::shm {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kControlOffset = kPage;
constexpr size_t kRingOffset = 2 * kPage;
constexpr int kCreateAttempts = 4;
static_assert(sizeof(SegmentHeader) <= kPage);
static_assert(2 * sizeof(RingControl) <= kPage);

// Closes a descriptor on every path out.
struct CloseOnExit {
  int fd;
  ~CloseOnExit() {
    if (fd >= 0) ::close(fd);
  }
};

StatusOr<void*> Map(int fd, size_t bytes, const std::string& name) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    return ErrnoStatus(StatusCode::kUnavailable, fmt::format("mmap of {} ({} bytes)", name, bytes),
                       errno);
  }
  return base;
}

}  // namespace

std::string JobId(const std::string& secret) {
  Sha256 h;
  static constexpr char kLabel[] = "kolo shm job v1";
  h.Update(kLabel, sizeof kLabel - 1);
  h.Update(secret.data(), secret.size());
  const Digest d = h.Final();
  return Hex(d.data(), 8);
}

size_t SegmentBytes(uint64_t ring_bytes) { return kRingOffset + 2 * ring_bytes; }

Status CheckRingBytes(uint64_t ring_bytes) {
  if (ring_bytes < kMinRingBytes || ring_bytes > kMaxRingBytes ||
      (ring_bytes & (ring_bytes - 1)) != 0) {
    return InvalidArgument(
        "shared-memory ring size {} bytes: must be a power of two from {} KiB to {} MiB",
        ring_bytes, kMinRingBytes >> 10, kMaxRingBytes >> 20);
  }
  return Status::OK();
}

Segment::~Segment() { Unmap(); }

Segment::Segment(Segment&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      name_(std::move(other.name_)) {}

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    Unmap();
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    name_ = std::move(other.name_);
  }
  return *this;
}

void Segment::Unmap() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
}

RingControl& Segment::control(int direction) const {
  return *reinterpret_cast<RingControl*>(static_cast<uint8_t*>(base_) + kControlOffset +
                                         static_cast<size_t>(direction) * sizeof(RingControl));
}

uint8_t* Segment::ring(int direction) const {
  return static_cast<uint8_t*>(base_) + kRingOffset +
         static_cast<size_t>(direction) * header()->ring_bytes;
}

bool IsSegmentName(const std::string& name, const std::string& job_id, int low, int high) {
  const std::string prefix = fmt::format("/kolo-{}-{}-{}-", job_id, low, high);
  if (name.size() != prefix.size() + 16 || name.compare(0, prefix.size(), prefix) != 0) {
    return false;
  }
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    const char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

StatusOr<Segment> Segment::Create(const std::string& job_id, int low, int high,
                                  uint64_t ring_bytes) {
  KOLO_RETURN_IF_ERROR(CheckRingBytes(ring_bytes));
  const size_t bytes = SegmentBytes(ring_bytes);
  SegmentNonce nonce;
  uint8_t suffix[8];
  if (!FillRandom(nonce.data(), nonce.size()) || !FillRandom(suffix, sizeof suffix)) {
    return Internal("no kernel randomness for a shared-memory segment name");
  }
  std::string name;
  int fd = -1;
  for (int attempt = 0; attempt < kCreateAttempts && fd < 0; ++attempt) {
    if (attempt > 0 && !FillRandom(suffix, sizeof suffix)) {
      return Internal("no kernel randomness for a shared-memory segment name");
    }
    name = fmt::format("/kolo-{}-{}-{}-{}", job_id, low, high, Hex(suffix, sizeof suffix));
    fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    // EEXIST: something already has this name (left over, or placed there): never use it.
    if (fd < 0 && errno != EEXIST) {
      return ErrnoStatus(StatusCode::kUnavailable,
                         fmt::format("shm_open({}, O_CREAT|O_EXCL)", name), errno);
    }
  }
  if (fd < 0) {
    return Unavailable("could not create a shared-memory segment: {} fresh names all existed",
                       kCreateAttempts);
  }
  CloseOnExit closer{fd};
  // From here on the name is ours: remove it on any failure.
  auto fail = [&name](Status s) {
    Unlink(name).IgnoreError();
    return s;
  };
  if (::fchmod(fd, 0600) != 0) {
    return fail(ErrnoStatus(StatusCode::kInternal, fmt::format("fchmod({})", name), errno));
  }
  const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err != 0) {
    return fail(Unavailable(
        "cannot reserve {} bytes of shared memory for ranks {} and {} ({}: {}); /dev/shm is "
        "too small? (set KOLO_SHM_RING_BYTES lower, or use --transport tcp)",
        bytes, low, high, name, std::strerror(err)));
  }
  auto base = Map(fd, bytes, name);
  if (!base.ok()) return fail(base.status());
  Segment segment(*base, bytes, name);
  auto* h = new (segment.base_) SegmentHeader;
  h->version = kSegmentVersion;
  h->low_rank = low;
  h->high_rank = high;
  h->ring_bytes = ring_bytes;
  h->total_bytes = bytes;
  h->nonce = nonce;
  for (int d = 0; d < 2; ++d) {
    new (&segment.control(d)) RingControl;
  }
  // The magic last: a segment caught half-written does not pass for one.
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kSegmentMagic;
  return segment;
}

StatusOr<Segment> Segment::Open(const std::string& name, const std::string& job_id, int low,
                                int high, uint64_t ring_bytes, const SegmentNonce& nonce) {
  if (!IsSegmentName(name, job_id, low, high)) {
    return ProtocolError(
        "rank {} announced the shared-memory segment '{}', not a name of this job's segment "
        "for ranks {} and {}",
        low, name, low, high);
  }
  KOLO_RETURN_IF_ERROR(CheckRingBytes(ring_bytes));
  const size_t bytes = SegmentBytes(ring_bytes);
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
  if (fd < 0) {
    return ErrnoStatus(
        StatusCode::kUnavailable,
        fmt::format("shm_open({}) of the segment rank {} made (are both ranks in the "
                    "same IPC namespace, with the same /dev/shm?)",
                    name, low),
        errno);
  }
  CloseOnExit closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return ErrnoStatus(StatusCode::kInternal, fmt::format("fstat({})", name), errno);
  }
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 07777) != 0600) {
    return Unavailable(
        "refusing shared-memory segment {}: owner uid {} mode {:o}, expected a regular file of "
        "uid {} with mode 600",
        name, st.st_uid, st.st_mode & 07777, ::geteuid());
  }
  if (static_cast<uint64_t>(st.st_size) != bytes) {
    return Unavailable("refusing shared-memory segment {}: {} bytes, expected {}", name, st.st_size,
                       bytes);
  }
  KOLO_ASSIGN_OR_RETURN(void* base, Map(fd, bytes, name));
  Segment segment(base, bytes, name);
  const SegmentHeader* h = segment.header();
  std::atomic_thread_fence(std::memory_order_acquire);
  if (h->magic != kSegmentMagic || h->version != kSegmentVersion || h->low_rank != low ||
      h->high_rank != high || h->ring_bytes != ring_bytes || h->total_bytes != bytes ||
      h->nonce != nonce) {
    return Unavailable(
        "refusing shared-memory segment {}: its header (magic {:#x}, version {}, ranks {} and {}, "
        "ring {} bytes) is not the one rank {} announced (a stale or foreign segment)",
        name, h->magic, h->version, h->low_rank, h->high_rank, h->ring_bytes, low);
  }
  return segment;
}

Status Unlink(const std::string& name) {
  if (name.empty() || ::shm_unlink(name.c_str()) == 0 || errno == ENOENT) return Status::OK();
  return ErrnoStatus(StatusCode::kInternal, fmt::format("shm_unlink({})", name), errno);
}

}  // namespace kolo::transport::shm
