#include "engine/common/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <random>

namespace kolo {
namespace {

std::string Dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// What may be written through: a regular file of this user, or a character device.
Status CheckTarget(const struct stat& st, const std::string& path, std::string_view what) {
  if (S_ISLNK(st.st_mode)) {
    return InvalidArgument(
        "{} '{}' is a symbolic link; kolo does not write through links: name the "
        "file itself",
        what, path);
  }
  if (S_ISCHR(st.st_mode)) return Status::OK();
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgument("{} '{}' exists and is not a regular file: name a file to write", what,
                           path);
  }
  if (st.st_uid != ::geteuid()) {
    return InvalidArgument(
        "{} '{}' belongs to user {}, not to this one ({}); kolo replaces only its own user's files",
        what, path, st.st_uid, ::geteuid());
  }
  return Status::OK();
}

Status WriteAll(int fd, std::string_view text, const std::string& path, std::string_view what) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return ErrnoStatus(StatusCode::kInternal, fmt::format("write {} '{}'", what, path), errno);
    }
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

// "a FIFO", "a directory", ...: what a path that is not a regular file is, for errors.
const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "of an unknown kind";
}

// What may be read: a regular file of at most `max_bytes`. Anything else (a FIFO, which would
// block or never end; a device such as /dev/zero, which never ends; a directory) is refused,
// naming what it is.
Status CheckReadable(const struct stat& st, const std::string& path, size_t max_bytes,
                     std::string_view what) {
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgument(
        "{} '{}' is {}, not a regular file: kolo reads only regular files (of at most {} bytes)",
        what, path, FileKind(st.st_mode), max_bytes);
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return InvalidArgument("{} '{}' is {} bytes, more than the {} allowed", what, path, st.st_size,
                           max_bytes);
  }
  return Status::OK();
}

}  // namespace

StatusOr<int> OpenForWriting(const std::string& path, mode_t mode, std::string_view what) {
  if (path.empty()) return InvalidArgument("{}: the path is empty; name a file to write", what);
  // O_NONBLOCK: opening a FIFO without a reader fails instead of blocking; cleared below.
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, mode);
  if (fd < 0) {
    const int err = errno;
    struct stat st {};
    if (err == ELOOP && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      return CheckTarget(st, path, what);
    }
    if (err == ENXIO)
      return InvalidArgument("{} '{}' is a FIFO or socket: name a file", what, path);
    return ErrnoStatus(StatusCode::kInvalidArgument, fmt::format("open {} '{}'", what, path), err);
  }
  struct stat st {};
  Status s = ::fstat(fd, &st) == 0 ? CheckTarget(st, path, what)
                                   : ErrnoStatus(StatusCode::kInternal, "fstat " + path, errno);
  if (s.ok() && S_ISREG(st.st_mode) && ::ftruncate(fd, 0) != 0) {
    s = ErrnoStatus(StatusCode::kInternal, fmt::format("truncate {} '{}'", what, path), errno);
  }
  if (s.ok() && ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    s = ErrnoStatus(StatusCode::kInternal, "fcntl " + path, errno);
  }
  if (!s.ok()) {
    ::close(fd);
    return s;
  }
  return fd;
}

Status WriteFileAtomically(const std::string& path, std::string_view text, mode_t mode,
                           std::string_view what) {
  if (path.empty()) return InvalidArgument("{}: the path is empty; name a file to write", what);
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && !S_ISLNK(st.st_mode)) {
    KOLO_RETURN_IF_ERROR(CheckTarget(st, path, what));
    if (S_ISCHR(st.st_mode)) {  // /dev/null and the like: written in place, never renamed over
      KOLO_ASSIGN_OR_RETURN(int fd, OpenForWriting(path, mode, what));
      Status s = WriteAll(fd, text, path, what);
      ::close(fd);
      return s;
    }
  }
  std::random_device random;
  const std::string tmp = fmt::format("{}.tmp.{}.{:08x}", path, ::getpid(), random());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) {
    return ErrnoStatus(StatusCode::kInvalidArgument, fmt::format("create {} '{}'", what, tmp),
                       errno);
  }
  Status s = WriteAll(fd, text, path, what);
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoStatus(StatusCode::kInternal, "fsync " + tmp, errno);
  if (::close(fd) != 0 && s.ok()) s = ErrnoStatus(StatusCode::kInternal, "close " + tmp, errno);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = ErrnoStatus(StatusCode::kInvalidArgument,
                    fmt::format("rename {} into place as '{}'", what, path), errno);
  }
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

Status CheckWritable(const std::string& path, std::string_view what) {
  if (path.empty()) return InvalidArgument("{}: the path is empty; name a file to write", what);
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      return InvalidArgument("{} '{}' is a directory: name a file to write", what, path);
    }
    KOLO_RETURN_IF_ERROR(CheckTarget(st, path, what));
  }
  const std::string dir = Dir(path);
  struct stat ds {};
  if (::stat(dir.c_str(), &ds) != 0 || !S_ISDIR(ds.st_mode)) {
    return InvalidArgument("{} '{}': its directory '{}' does not exist", what, path, dir);
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return InvalidArgument("{} '{}': this user may not create files in '{}'", what, path, dir);
  }
  return Status::OK();
}

StatusOr<std::string> ReadFileBounded(const std::string& path, size_t max_bytes,
                                      std::string_view what) {
  if (path.empty()) return InvalidArgument("{}: the path is empty; name a file to read", what);
  // Looked at before it is opened, so that a device is never opened at all (opening some has
  // effects of its own); checked again on the descriptor below, in case the path changed between.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    KOLO_RETURN_IF_ERROR(CheckReadable(st, path, max_bytes, what));
  }
  // O_NONBLOCK: a FIFO opens at once, with or without a writer, instead of waiting for one (and
  // is then refused); O_NOCTTY: a terminal named by mistake does not become ours.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    return ErrnoStatus(StatusCode::kNotFound, fmt::format("{} '{}' cannot be read", what, path),
                       errno);
  }
  Status s = ::fstat(fd, &st) == 0 ? CheckReadable(st, path, max_bytes, what)
                                   : ErrnoStatus(StatusCode::kInternal, "fstat " + path, errno);
  std::string text;
  while (s.ok()) {
    // Bounded even if the file grows while it is read, and for files whose size says nothing
    // (those of /proc report 0).
    char buf[65536];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      s = ErrnoStatus(StatusCode::kInternal, fmt::format("read {} '{}'", what, path), errno);
    } else if (n == 0) {
      break;
    } else if (text.size() + static_cast<size_t>(n) > max_bytes) {
      s = InvalidArgument("{} '{}' grew past the {} bytes allowed while it was read", what, path,
                          max_bytes);
    } else {
      text.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  if (!s.ok()) return s;
  return text;
}

}  // namespace kolo
