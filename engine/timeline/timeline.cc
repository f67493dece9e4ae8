#include "engine/timeline/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>

#include "engine/common/logging.h"

namespace kolo::timeline {
namespace {

// Closes the event array and the object. Every append overwrites it, so it is always the last
// thing in the file.
constexpr std::string_view kTail = "\n]}\n";
// The file is kept this far ahead of the tail, rounded up to a multiple (see AppendScratchLocked).
constexpr int64_t kReserveBytes = 1 << 20;

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
  std::string path;
  int rank = 0;
  int fd = -1;
  std::chrono::steady_clock::time_point start;

  // Guards everything below. Held across formatting and the write so that the file order is the
  // timestamp order and appends never interleave.
  std::mutex mu;
  int64_t tail_offset = 0;                    // where kTail starts; the next event goes here
  std::unordered_map<std::string, int> tids;  // tensor -> track, assigned on first use
  std::string scratch;                        // reused so a steady-state event does not allocate
  int64_t reserved_end = 0;  // file size: the tail, then spaces (see AppendScratchLocked)
  std::string padding;       // the spaces of the next reserve
  bool failed = false;       // a write failed; the file keeps what it had

  int64_t Now() const {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                                 start)
        .count();
  }

  // Writes `data` at `offset`, continuing after short writes. Returns 0 or the errno.
  int WriteAll(const std::string& data, int64_t offset) const;
  // Appends scratch (one or more events, each starting with a comma) followed by kTail over the
  // current tail. On failure the previous tail is restored, `failed` is set and the error returned.
  Status AppendScratchLocked();
  // Returns the track of `tensor`, first emitting its thread_name metadata into scratch.
  int TidLocked(const std::string& tensor);
  void Event(char phase, const std::string& tensor, const std::string& name,
             const std::string& args_json);
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

// Why every event is written at once, without a user-space buffer: a write into the page cache
// costs about a microsecond, and an event that is in the file survives a crash of the process, so
// there is no flush to forget and nothing to do at exit but trim the reserve.
//
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
Status Timeline::Impl::AppendScratchLocked() {
  scratch.append(kTail);
  const int64_t tail_size = static_cast<int64_t>(kTail.size());
  const int64_t end = tail_offset + static_cast<int64_t>(scratch.size());
  int err = 0;
  if (end > reserved_end) {
    const int64_t from = std::max(reserved_end, tail_offset + tail_size);
    const int64_t to = (end / kReserveBytes + 1) * kReserveBytes;
    padding.assign(static_cast<size_t>(to - from), ' ');
    err = WriteAll(padding, from);
    if (err == 0) reserved_end = to;
  }
  if (err == 0) err = WriteAll(scratch, tail_offset);
  if (err != 0) {
    failed = true;
    // Best effort: put a tail back where the last complete event ended and drop the partial one.
    if (WriteAll(std::string(kTail), tail_offset) == 0 &&
        ::ftruncate(fd, static_cast<off_t>(tail_offset + tail_size)) == 0) {
      reserved_end = tail_offset + tail_size;
    }
    return ErrnoStatus(StatusCode::kInternal, "write timeline file '" + path + "'", err);
  }
  tail_offset = end - tail_size;
  return Status::OK();
}

int Timeline::Impl::TidLocked(const std::string& tensor) {
  auto it = tids.find(tensor);
  if (it != tids.end()) return it->second;
  const int tid = static_cast<int>(tids.size()) + 1;
  tids.emplace(tensor, tid);
  scratch += ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":";
  scratch += std::to_string(rank);
  scratch += ",\"tid\":";
  scratch += std::to_string(tid);
  scratch += ",\"args\":{\"name\":";
  AppendQuoted(&scratch, tensor);
  // Tracks are listed in the order tensors first appeared.
  scratch += "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":";
  scratch += std::to_string(rank);
  scratch += ",\"tid\":";
  scratch += std::to_string(tid);
  scratch += ",\"args\":{\"sort_index\":";
  scratch += std::to_string(tid);
  scratch += "}}";
  return tid;
}

void Timeline::Impl::Event(char phase, const std::string& tensor, const std::string& name,
                           const std::string& args_json) {
  // A malformed args text would make the whole file unparsable, so it is kept as a string instead.
  const size_t first = args_json.find_first_not_of(" \t\r\n");
  const bool args_is_object =
      first != std::string::npos && args_json[first] == '{' && nlohmann::json::accept(args_json);
  std::lock_guard<std::mutex> lock(mu);
  if (failed) return;
  scratch.clear();
  const int tid = TidLocked(tensor);
  scratch += ",\n{\"name\":";
  AppendQuoted(&scratch, name);
  scratch += ",\"ph\":\"";
  scratch += phase;
  scratch += "\",\"ts\":";
  scratch += std::to_string(Now());
  scratch += ",\"pid\":";
  scratch += std::to_string(rank);
  scratch += ",\"tid\":";
  scratch += std::to_string(tid);
  if (phase == 'i') scratch += ",\"s\":\"t\"";
  if (args_is_object) {
    scratch += ",\"args\":";
    scratch += args_json;
  } else if (!args_json.empty()) {
    scratch += ",\"args\":{\"unparsed\":";
    AppendQuoted(&scratch, args_json);
    scratch += '}';
  }
  scratch += '}';
  const Status s = AppendScratchLocked();
  if (!s.ok()) KOLO_LOG(kWarning, "{}; no further events are recorded", s.message());
}

StatusOr<std::unique_ptr<Timeline>> Timeline::Open(const std::string& path, int rank) {
  if (path.empty()) return InvalidArgument("timeline path is empty: name a file to write");
  if (rank < 0) return InvalidArgument("timeline '{}': rank {} is negative", path, rank);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return ErrnoStatus(StatusCode::kInvalidArgument, "open timeline file '" + path + "'", errno)
        .WithContext("KOLO_TIMELINE must name a writable file");
  }
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->rank = rank;
  impl->fd = fd;
  impl->start = std::chrono::steady_clock::now();
  // The header ends in the first element, so every later event starts with a comma.
  std::string& s = impl->scratch;
  s = "{\"traceEvents\":[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":";
  s += std::to_string(rank);
  s += ",\"tid\":0,\"args\":{\"name\":\"rank ";
  s += std::to_string(rank);
  s += "\"}},\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":";
  s += std::to_string(rank);
  s += ",\"tid\":0,\"args\":{\"sort_index\":";
  s += std::to_string(rank);
  s += "}}";
  impl->tail_offset = static_cast<int64_t>(s.size());
  s += kTail;
  // The first reserve goes out with the header, in the same large write (see AppendScratchLocked).
  s.resize(static_cast<size_t>(std::max<int64_t>(kReserveBytes, static_cast<int64_t>(s.size()))),
           ' ');
  if (const int err = impl->WriteAll(s, 0); err != 0) {
    ::close(fd);
    return ErrnoStatus(StatusCode::kInternal, "write timeline file '" + path + "'", err);
  }
  impl->reserved_end = static_cast<int64_t>(s.size());
  return std::unique_ptr<Timeline>(new Timeline(std::move(impl)));
}

Timeline::Timeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Timeline::~Timeline() {
  if (!impl_ || impl_->fd < 0) return;
  // Every event is already in the file; only the reserve of spaces is dropped. If that fails the
  // file still parses, so there is nothing to report.
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

int64_t Timeline::NowMicros() const { return impl_->Now(); }

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
