// Files kolo writes and reads on a user's behalf (timelines, run records, profiles, benchmark
// reports), handled so that another local user cannot redirect them: a path whose last component
// is a symbolic link is refused (O_NOFOLLOW), an existing file is written only when it is a regular
// file this user owns (or a character device such as /dev/null), new files get the mode asked for,
// and reads of user-named files are bounded.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "engine/common/status.h"

namespace kolo {

// Opens `path` for writing from its start: creates it with `mode` (less the umask) or, when it
// exists, truncates it if it is a regular file this user owns. Refuses a symbolic link, a file of
// another user, a directory, a FIFO or socket (never blocks on one). `what` names the file in
// errors ("timeline", "--json"). Returns a close-on-exec descriptor the caller closes.
StatusOr<int> OpenForWriting(const std::string& path, mode_t mode, std::string_view what);

// Replaces `path` with `text` atomically: a new file beside it (O_EXCL, O_NOFOLLOW, `mode`),
// written, synced and renamed over `path` (rename replaces a link at `path` rather than following
// it). A reader sees the old file or the whole new one.
Status WriteFileAtomically(const std::string& path, std::string_view text, mode_t mode,
                           std::string_view what);

// Checks, before any work, that `path` could be written later: not a link, a directory or another
// user's file, in an existing directory this user may write. Creates nothing.
Status CheckWritable(const std::string& path, std::string_view what);

// Reads the whole of `path`, a regular file of at most `max_bytes`. Every file kolo reads goes
// through here, user-named or not. Refused, with the path, what it is and what is allowed: a
// FIFO (never waited on: it is opened without blocking and refused), a device such as /dev/zero
// (never opened), a directory, a socket; a file larger than `max_bytes`, or one that grows past it
// while it is read. `what` names the file in errors ("--calibration", "replay profile").
StatusOr<std::string> ReadFileBounded(const std::string& path, size_t max_bytes,
                                      std::string_view what);

}  // namespace kolo
