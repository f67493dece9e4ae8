// Timeline: every phase of every tensor as Chrome trace events (loads in Perfetto and
// chrome://tracing).
//
// One file per rank (see Options::timeline_path). Events carry pid = rank and one tid per tensor,
// named by a thread_name metadata event, so per-rank files can be merged by concatenating their
// event arrays; the process_name metadata's monotonic_start_us (where time 0 lies on the host's
// CLOCK_MONOTONIC) lets files from one host be shifted onto one clock (scripts/timeline-merge).
// The file is valid JSON at every moment: events are buffered and appended in
// batches (at most 2 ms after they are recorded, on Flush() and on destruction), each append
// overwriting the closing bracket, so a process that dies mid-run leaves a file that parses and
// holds every event flushed before it died; the exception, a write cut by SIGKILL at a page
// boundary, leaves the file valid up to that boundary and spaces after it (timeline.cc).
//
// Thread-safe: the trainer's threads (QUEUE begins at submission) and the background thread write
// concurrently. Events are formatted into the buffer under one mutex; a writer thread owned by the
// Timeline does the file I/O. A timeline that is not open costs one branch per call.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/common/status.h"

namespace kolo::timeline {

class Timeline {
 public:
  // Creates (truncates) `path` and writes the trace header.
  static StatusOr<std::unique_ptr<Timeline>> Open(const std::string& path, int rank);
  // Writes what is buffered and closes the file.
  ~Timeline();

  // Starts / ends activity `name` (e.g. "NEGOTIATE", "MEMCPY_IN_FUSION_BUFFER") on the track of
  // `tensor`. `args_json` is an optional JSON object text ("{\"bytes\":1024}") attached to the
  // event. Nested Begin/End pairs on one track must be properly nested.
  void Begin(const std::string& tensor, const std::string& name, const std::string& args_json = "");
  void End(const std::string& tensor, const std::string& name);
  // A zero-duration marker on the track of `tensor`.
  void Instant(const std::string& tensor, const std::string& name,
               const std::string& args_json = "");

  // Writes every event recorded before the call to the file. Returns the first write error
  // (after which events are dropped; the file keeps what it had), or OK.
  Status Flush();

  // Microseconds since the timeline was opened (the events' clock).
  int64_t NowMicros() const;
  const std::string& path() const;

 private:
  struct Impl;
  explicit Timeline(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The file rank `rank` writes for Options::timeline_path `path`: "%r" replaced by the rank;
// otherwise ranks other than 0 insert ".rank<N>" before the extension ("t.json" -> "t.rank1.json").
std::string TimelinePathForRank(const std::string& path, int rank);

}  // namespace kolo::timeline
