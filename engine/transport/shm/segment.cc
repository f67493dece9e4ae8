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

// Linux 6.3's flag, absent from older headers: the file can never be made executable.
#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif

namespace kolo::transport::shm {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kControlOffset = kPage;
constexpr size_t kRingOffset = 2 * kPage;
static_assert(sizeof(SegmentHeader) <= kPage);
static_assert(2 * sizeof(RingControl) <= kPage);

std::string Describe(int low, int high) {
  return fmt::format("the shared-memory segment of ranks {} and {}", low, high);
}

StatusOr<void*> Map(int fd, size_t bytes, int low, int high) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    return ErrnoStatus(StatusCode::kUnavailable,
                       fmt::format("mmap of {} ({} bytes)", Describe(low, high), bytes), errno);
  }
  return base;
}

}  // namespace

int MemoryFile(const std::string& label) {
  const int fd = ::memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);
  if (fd >= 0 || errno != EINVAL) return fd;
  return ::memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
}

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
    : base_(std::exchange(other.base_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    Unmap();
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
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

StatusOr<Segment> Segment::Create(const std::string& job_id, int low, int high, uint64_t ring_bytes,
                                  tcp::Fd* descriptor) {
  KOLO_RETURN_IF_ERROR(CheckRingBytes(ring_bytes));
  const size_t bytes = SegmentBytes(ring_bytes);
  SegmentNonce nonce;
  if (!FillRandom(nonce.data(), nonce.size())) {
    return Internal("no kernel randomness for the nonce of {}", Describe(low, high));
  }
  const std::string label = fmt::format("kolo-{}-{}-{}", job_id, low, high);
  tcp::Fd fd(MemoryFile(label));
  if (!fd.valid()) {
    return ErrnoStatus(StatusCode::kUnavailable,
                       fmt::format("memfd_create({}) for {}", label, Describe(low, high)), errno);
  }
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ErrnoStatus(StatusCode::kUnavailable,
                       fmt::format("ftruncate of {} to {} bytes", Describe(low, high), bytes),
                       errno);
  }
  const int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes));
  if (err != 0) {
    return Unavailable(
        "cannot reserve {} bytes of shared memory for ranks {} and {} ({}); is this host's (or "
        "this job's) memory short? (set KOLO_SHM_RING_BYTES lower, or use --transport tcp)",
        bytes, low, high, std::strerror(err));
  }
  if (::fcntl(fd.get(), F_ADD_SEALS, kSizeSeals) != 0) {
    return ErrnoStatus(StatusCode::kInternal,
                       fmt::format("sealing the size of {}", Describe(low, high)), errno);
  }
  KOLO_ASSIGN_OR_RETURN(void* base, Map(fd.get(), bytes, low, high));
  Segment segment(base, bytes);
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
  *descriptor = std::move(fd);
  return segment;
}

StatusOr<Segment> Segment::Open(tcp::Fd descriptor, int low, int high, uint64_t ring_bytes,
                                const SegmentNonce& nonce) {
  KOLO_RETURN_IF_ERROR(CheckRingBytes(ring_bytes));
  const size_t bytes = SegmentBytes(ring_bytes);
  const int fd = descriptor.get();
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return ErrnoStatus(
        StatusCode::kInternal,
        fmt::format("fstat of the descriptor rank {} sent for {}", low, Describe(low, high)),
        errno);
  }
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
    return Unavailable(
        "refusing {} that rank {} sent: file type {:o}, owner uid {}; expected a regular file of "
        "uid {}",
        Describe(low, high), low, st.st_mode & S_IFMT, st.st_uid, ::geteuid());
  }
  if (static_cast<uint64_t>(st.st_size) != bytes) {
    return Unavailable("refusing {} that rank {} sent: {} bytes, expected {}", Describe(low, high),
                       low, st.st_size, bytes);
  }
  // Only memory files made to allow sealing can carry these seals: the descriptor is such a file,
  // and its size, just checked, is the size it keeps.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & kSizeSeals) != kSizeSeals) {
    return Unavailable(
        "refusing {} that rank {} sent: {} (expected a memory file sealed against any change of "
        "its size)",
        Describe(low, high), low,
        seals < 0 ? fmt::format("F_GET_SEALS failed: {}", std::strerror(errno))
                  : fmt::format("seals {:#x}", seals));
  }
  KOLO_ASSIGN_OR_RETURN(void* base, Map(fd, bytes, low, high));
  descriptor.reset();  // the mapping keeps the memory
  Segment segment(base, bytes);
  const SegmentHeader* h = segment.header();
  std::atomic_thread_fence(std::memory_order_acquire);
  if (h->magic != kSegmentMagic || h->version != kSegmentVersion || h->low_rank != low ||
      h->high_rank != high || h->ring_bytes != ring_bytes || h->total_bytes != bytes ||
      h->nonce != nonce) {
    return Unavailable(
        "refusing {} that rank {} sent: its header (magic {:#x}, version {}, ranks {} and {}, "
        "ring {} bytes) is not the one announced with it (a foreign segment)",
        Describe(low, high), low, h->magic, h->version, h->low_rank, h->high_rank, h->ring_bytes);
  }
  return segment;
}

}  // namespace kolo::transport::shm
