#include "engine/timeline/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/common/file.h"
#include "engine/common/logging.h"
#include "engine/common/mutex.h"
#include "engine/common/thread_annotations.h"

namespace kolo::timeline {
namespace {

// Closes the event array and the object. Every append overwrites it, so it is always the last
// thing in the file.
constexpr std::string_view kTail = "\n]}\n";
// The file is kept this far ahead of the tail, rounded up to a multiple (see AppendPieceLocked).
constexpr int64_t kReserveBytes = 1 << 20;
// Events reach the file at most this long after they are recorded...
constexpr std::chrono::milliseconds kFlushInterval(2);
// ...or sooner, once this much is buffered.
constexpr size_t kFlushBytes = 256 << 10;
// A batch is written in pieces that do not pass multiples of this (see AppendBatchLocked): the
// page size, the smallest folio, so that where the file system keeps 4 KiB folios only the one
// piece that passes each page boundary can be cut there, not one spanning many.
constexpr int64_t kPieceBytes = 4 << 10;
// Past this the producers write themselves instead of buffering more.
constexpr size_t kMaxPendingBytes = 16 << 20;

// Appends `s` as the body of a JSON string (without quotes). Bytes that are not valid UTF-8 become
// U+FFFD so that a strict parser still accepts the file whatever a tensor is called.
void AppendEscaped(std::string* out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      switch (c) {
        case '"':
          *out += "\\\"";
          break;
        case '\\':
          *out += "\\\\";
          break;
        case '\n':
          *out += "\\n";
          break;
        case '\r':
          *out += "\\r";
          break;
        case '\t':
          *out += "\\t";
          break;
        case '\b':
          *out += "\\b";
          break;
        case '\f':
          *out += "\\f";
          break;
        default:
          if (c < 0x20) {
            *out += "\\u00";
            *out += kHex[c >> 4];
            *out += kHex[c & 0xf];
          } else {
            *out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // Multi-byte sequence: accept only well-formed, shortest-form, non-surrogate code points.
    size_t len = 0;
    uint32_t cp = 0;
    if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    }
    bool valid = len != 0 && i + len <= n;
    for (size_t k = 1; valid && k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) valid = false;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if (valid) {
      static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      valid = cp >= kMin[len] && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    }
    if (valid) {
      out->append(s.data() + i, len);
      i += len;
    } else {
      *out += "\\ufffd";
      ++i;
    }
  }
}

void AppendQuoted(std::string* out, std::string_view s) {
  *out += '"';
  AppendEscaped(out, s);
  *out += '"';
}

}  // namespace

struct Timeline::Impl {
  // Set by Open before the flusher starts, then read-only: read without a lock, not guarded.
  std::string path;
  int rank = 0;
  int fd = -1;
  std::chrono::steady_clock::time_point start;

  // Lock order: write_mu, then mu. Writers of events take only mu, so they never wait for I/O
  // unless the buffer outgrows kMaxPendingBytes.
  Mutex write_mu;  // guards the file state below; held across every write
  // Where kTail starts; the next batch goes here.
  int64_t tail_offset KOLO_GUARDED_BY(write_mu) = 0;
  // The file size: the tail, then spaces (see AppendPieceLocked).
  int64_t reserved_end KOLO_GUARDED_BY(write_mu) = 0;
  // The batch being written (swapped with pending), and where each of its events ends.
  std::string writing KOLO_GUARDED_BY(write_mu);
  std::vector<size_t> writing_ends KOLO_GUARDED_BY(write_mu);
  // The part of `writing` that one pwrite appends.
  std::string piece KOLO_GUARDED_BY(write_mu);
  // The spaces of the next reserve.
  std::string padding KOLO_GUARDED_BY(write_mu);
  // The first write error; nothing is written after it.
  Status error KOLO_GUARDED_BY(write_mu);

  Mutex mu;    // guards the event state below; held while an event is formatted
  CondVar cv;  // wakes the flusher
  // Tensor -> track, assigned on first use.
  std::unordered_map<std::string, int> tids KOLO_GUARDED_BY(mu);
  // Formatted events not yet written, each starting with a comma, and where each of them ends.
  std::string pending KOLO_GUARDED_BY(mu);
  std::vector<size_t> pending_ends KOLO_GUARDED_BY(mu);
  // When pending became non-empty.
  std::chrono::steady_clock::time_point first_pending KOLO_GUARDED_BY(mu);
  // The last args text that parsed as a JSON object.
  std::string last_accepted_args KOLO_GUARDED_BY(mu);
  bool stop KOLO_GUARDED_BY(mu) = false;

  std::atomic<bool> failed{false};  // error is set: events are dropped without formatting
  // Started by Open, joined by ~Timeline; nothing else touches it.
  std::thread flusher;

  int64_t MicrosSinceStart(std::chrono::steady_clock::time_point t) const {
    return std::chrono::duration_cast<std::chrono::microseconds>(t - start).count();
  }
  // Writes `data` at `offset`, continuing after short writes. Returns 0 or the errno.
  int WriteAll(const std::string& data, int64_t offset) const;
  // Appends `writing` to the file in pieces (see AppendBatchLocked).
  Status AppendBatchLocked() KOLO_REQUIRES(write_mu);
  // Appends `piece` (events, each starting with a comma) and kTail over the current tail.
  Status AppendPieceLocked() KOLO_REQUIRES(write_mu);
  // Moves pending into the file. Returns the sticky error.
  Status FlushNow() KOLO_EXCLUDES(write_mu, mu);
  void FlusherLoop() KOLO_EXCLUDES(write_mu, mu);
  // Returns the track of `tensor`, first adding its metadata events to pending.
  int TidLocked(const std::string& tensor) KOLO_REQUIRES(mu);
  void Event(char phase, const std::string& tensor, const std::string& name,
             const std::string& args_json) KOLO_EXCLUDES(write_mu, mu);
};

int Timeline::Impl::WriteAll(const std::string& data, int64_t offset) const {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::pwrite(fd, data.data() + done, data.size() - done,
                               static_cast<off_t>(offset + static_cast<int64_t>(done)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    done += static_cast<size_t>(n);
  }
  return 0;
}

// Why the reserve: Linux copies a write one folio at a time and gives up between folios when a
// fatal signal is pending, so an append that spans a folio boundary can be cut there, leaving the
// old closing bracket overwritten and the new one unwritten. The boundary is also a preemption
// point, so a killer woken meanwhile lands there often: with 4 KiB folios, about 1% of SIGKILLs
// sent to a process appending without pause on a loaded machine cut the file. The document's end
// has to pass each boundary once, so this cannot be ruled out, only made rarer: the space ahead is
// written in one large aligned write, which lets the page cache hold it in large folios where the
// file system supports them (ext4 and xfs on recent kernels), so boundaries come up to a reserve
// apart instead of every page. Spaces after the closing bracket are valid JSON; the destructor
// trims them.
//
// The same cut can happen at any boundary inside a large batch, so a batch goes out in pieces that
// each end before the next kPieceBytes boundary: only the piece that has to pass a boundary does,
// with just the old tail (and at most one event) before it.
Status Timeline::Impl::AppendBatchLocked() {
  const auto tail_size = static_cast<int64_t>(kTail.size());
  size_t pos = 0;
  size_t next = 0;  // index into writing_ends of the first event not yet written
  while (next < writing_ends.size()) {
    int64_t limit = ((tail_offset + tail_size) / kPieceBytes + 1) * kPieceBytes;
    auto piece_end = [&](size_t j) KOLO_REQUIRES(write_mu) {
      return tail_offset + static_cast<int64_t>(writing_ends[j] - pos) + tail_size;
    };
    if (piece_end(next) > limit) limit += kPieceBytes;  // this piece passes the boundary
    size_t last = next + 1;
    while (last < writing_ends.size() && piece_end(last) <= limit) ++last;
    piece.assign(writing, pos, writing_ends[last - 1] - pos);
    KOLO_RETURN_IF_ERROR(AppendPieceLocked());
    pos = writing_ends[last - 1];
    next = last;
  }
  return Status::OK();
}

Status Timeline::Impl::AppendPieceLocked() {
  piece.append(kTail);
  const auto tail_size = static_cast<int64_t>(kTail.size());
  const int64_t end = tail_offset + static_cast<int64_t>(piece.size());
  int err = 0;
  if (end > reserved_end) {
    const int64_t from = std::max(reserved_end, tail_offset + tail_size);
    const int64_t to = (end / kReserveBytes + 1) * kReserveBytes;
    padding.assign(static_cast<size_t>(to - from), ' ');
    err = WriteAll(padding, from);
    if (err == 0) reserved_end = to;
  }
  if (err == 0) err = WriteAll(piece, tail_offset);
  if (err != 0) {
    // Best effort: put a tail back where the last complete piece ended and drop the partial one.
    if (WriteAll(std::string(kTail), tail_offset) == 0 &&
        ::ftruncate(fd, static_cast<off_t>(tail_offset + tail_size)) == 0) {
      reserved_end = tail_offset + tail_size;
    }
    return ErrnoStatus(StatusCode::kInternal, "write timeline file '" + path + "'", err);
  }
  tail_offset = end - tail_size;
  return Status::OK();
}

Status Timeline::Impl::FlushNow() {
  MutexLock write_lock(write_mu);
  {
    MutexLock lock(mu);
    writing.swap(pending);  // pending keeps the old batch's capacity
    writing_ends.swap(pending_ends);
    pending.clear();
    pending_ends.clear();
  }
  if (!writing.empty() && error.ok()) {
    error = AppendBatchLocked();
    if (!error.ok()) {
      failed = true;
      KOLO_LOG(kWarning, "{}; the timeline records no further events", error.message());
    }
  }
  writing.clear();
  writing_ends.clear();
  return error;
}

// Why a writer thread: a pwrite costs 1-4 us here (the most on a journaling file system), too much
// for the engine's thread to pay per event, while formatting into memory costs a fraction of a
// microsecond. The writer appends each batch as described above, so the file is valid JSON at
// every moment and at most kFlushInterval behind.
void Timeline::Impl::FlusherLoop() {
  mu.lock();
  while (!stop) {
    if (pending.empty()) {
      // Bounded only so that no wait is unbounded; an idle timeline has nothing to do.
      cv.WaitFor(mu, std::chrono::seconds(1));
      continue;
    }
    const auto due = first_pending + kFlushInterval;
    if (pending.size() < kFlushBytes && std::chrono::steady_clock::now() < due) {
      cv.WaitUntil(mu, due);
      continue;
    }
    mu.unlock();
    FlushNow().IgnoreError();  // logged once by FlushNow; Flush() callers get it too
    mu.lock();
  }
  mu.unlock();
  FlushNow().IgnoreError();
}

int Timeline::Impl::TidLocked(const std::string& tensor) {
  auto it = tids.find(tensor);
  if (it != tids.end()) return it->second;
  const int tid = static_cast<int>(tids.size()) + 1;
  tids.emplace(tensor, tid);
  pending += ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":";
  pending += std::to_string(rank);
  pending += ",\"tid\":";
  pending += std::to_string(tid);
  pending += ",\"args\":{\"name\":";
  AppendQuoted(&pending, tensor);
  // Tracks are listed in the order tensors first appeared.
  pending += "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":";
  pending += std::to_string(rank);
  pending += ",\"tid\":";
  pending += std::to_string(tid);
  pending += ",\"args\":{\"sort_index\":";
  pending += std::to_string(tid);
  pending += "}}";
  return tid;
}

void Timeline::Impl::Event(char phase, const std::string& tensor, const std::string& name,
                           const std::string& args_json) {
  if (failed.load(std::memory_order_relaxed)) return;
  bool wake = false;
  bool write_here = false;
  {
    MutexLock lock(mu);
    // A malformed args text would make the whole file unparsable, so it is kept as a string
    // instead. A fused group sends the same args for every tensor, so the last text that passed
    // is not parsed again.
    bool args_is_object = !args_json.empty() && args_json == last_accepted_args;
    if (!args_is_object) {
      const size_t first = args_json.find_first_not_of(" \t\r\n");
      args_is_object = first != std::string::npos && args_json[first] == '{' &&
                       nlohmann::json::accept(args_json);
      if (args_is_object) last_accepted_args = args_json;
    }
    // Taken under the lock so that the file is in timestamp order.
    const auto now = std::chrono::steady_clock::now();
    const size_t before = pending.size();
    if (before == 0) first_pending = now;
    const int tid = TidLocked(tensor);
    pending += ",\n{\"name\":";
    AppendQuoted(&pending, name);
    pending += ",\"ph\":\"";
    pending += phase;
    pending += "\",\"ts\":";
    pending += std::to_string(MicrosSinceStart(now));
    pending += ",\"pid\":";
    pending += std::to_string(rank);
    pending += ",\"tid\":";
    pending += std::to_string(tid);
    if (phase == 'i') pending += ",\"s\":\"t\"";
    if (args_is_object) {
      pending += ",\"args\":";
      pending += args_json;
    } else if (!args_json.empty()) {
      pending += ",\"args\":{\"unparsed\":";
      AppendQuoted(&pending, args_json);
      pending += '}';
    }
    pending += '}';
    pending_ends.push_back(pending.size());
    // The flusher sleeps until the first event's deadline, so it needs waking only to start a
    // batch or to cut one short.
    wake = before == 0 || (before < kFlushBytes && pending.size() >= kFlushBytes);
    write_here = pending.size() >= kMaxPendingBytes;
  }
  if (wake) cv.notify_one();
  // The flusher is behind (a slow disk): the producers pay for the writes rather than memory.
  if (write_here) FlushNow().IgnoreError();
}

StatusOr<std::unique_ptr<Timeline>> Timeline::Open(const std::string& path, int rank) {
  if (path.empty()) return InvalidArgument("timeline path is empty: name a file to write");
  if (rank < 0) return InvalidArgument("timeline '{}': rank {} is negative", path, rank);
  auto opened = OpenForWriting(path, 0644, "timeline file");
  if (!opened.ok()) {
    return opened.status().WithContext("KOLO_TIMELINE must name a writable file");
  }
  const int fd = *opened;
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->rank = rank;
  impl->fd = fd;
  impl->start = std::chrono::steady_clock::now();
  {
    // No other thread can see impl yet, so the lock is uncontended: it is taken because the file
    // state is guarded by write_mu (KOLO_GUARDED_BY) and the analysis checks this function too.
    MutexLock write_lock(impl->write_mu);
    // The header ends in the first element, so every later event starts with a comma.
    std::string& s = impl->writing;
    s = "{\"traceEvents\":[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":";
    s += std::to_string(rank);
    s += ",\"tid\":0,\"args\":{\"name\":\"rank ";
    s += std::to_string(rank);
    // Where this file's time 0 lies on the host's monotonic clock (CLOCK_MONOTONIC, shared by
    // every process of a host and by the network namespaces of an emulated cluster), so that the
    // timelines of several ranks can be put on one clock.
    s += "\",\"monotonic_start_us\":";
    s += std::to_string(
        std::chrono::duration_cast<std::chrono::microseconds>(impl->start.time_since_epoch())
            .count());
    s += "}},\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":";
    s += std::to_string(rank);
    s += ",\"tid\":0,\"args\":{\"sort_index\":";
    s += std::to_string(rank);
    s += "}}";
    impl->tail_offset = static_cast<int64_t>(s.size());
    s += kTail;
    // The first reserve goes out with the header, in the same large write (see
    // AppendPieceLocked).
    s.resize(static_cast<size_t>(std::max<int64_t>(kReserveBytes, static_cast<int64_t>(s.size()))),
             ' ');
    if (const int err = impl->WriteAll(s, 0); err != 0) {
      ::close(fd);
      return ErrnoStatus(StatusCode::kInternal, "write timeline file '" + path + "'", err);
    }
    impl->reserved_end = static_cast<int64_t>(s.size());
    s.clear();
  }
  Impl* raw = impl.get();
  try {
    impl->flusher = std::thread([raw] { raw->FlusherLoop(); });
  } catch (const std::system_error& e) {
    ::close(fd);
    return Internal("timeline '{}': cannot start its writer thread: {}", path, e.what());
  }
  return std::unique_ptr<Timeline>(new Timeline(std::move(impl)));
}

Timeline::Timeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Timeline::~Timeline() {
  if (!impl_) return;
  {
    MutexLock lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_one();
  impl_->flusher.join();  // it writes what is pending before it returns
  // Only the reserve of spaces is left to drop. If that fails the file still parses.
  (void)!::ftruncate(impl_->fd, static_cast<off_t>(impl_->tail_offset + kTail.size()));
  ::close(impl_->fd);
}

void Timeline::Begin(const std::string& tensor, const std::string& name,
                     const std::string& args_json) {
  impl_->Event('B', tensor, name, args_json);
}

void Timeline::End(const std::string& tensor, const std::string& name) {
  impl_->Event('E', tensor, name, "");
}

void Timeline::Instant(const std::string& tensor, const std::string& name,
                       const std::string& args_json) {
  impl_->Event('i', tensor, name, args_json);
}

Status Timeline::Flush() { return impl_->FlushNow(); }

int64_t Timeline::NowMicros() const {
  return impl_->MicrosSinceStart(std::chrono::steady_clock::now());
}

const std::string& Timeline::path() const { return impl_->path; }

std::string TimelinePathForRank(const std::string& path, int rank) {
  if (path.empty()) return path;
  const std::string r = std::to_string(rank);
  if (path.find("%r") != std::string::npos) {
    std::string out;
    for (size_t i = 0; i < path.size(); ++i) {
      if (path[i] == '%' && i + 1 < path.size() && path[i + 1] == 'r') {
        out += r;
        ++i;
      } else {
        out += path[i];
      }
    }
    return out;
  }
  if (rank == 0) return path;
  // The extension is the last dot of the file name, unless the name starts with it (".trace").
  const size_t base = path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1;
  const size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || dot <= base) return path + ".rank" + r;
  return path.substr(0, dot) + ".rank" + r + path.substr(dot);
}

}  // namespace kolo::timeline
