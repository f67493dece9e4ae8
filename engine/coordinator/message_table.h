// The coordinator's table (rank 0 only): which ranks have reported which tensors.
//
// Requests arrive from every rank each negotiation round; a tensor becomes a Response once every
// rank has reported it (or an error Response when the ranks disagree on its properties). The table
// also serves the stall inspector: tensors reported by some ranks but not all for too long.
// Not thread-safe (background thread only).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "engine/coordinator/message.h"

namespace kolo::coordinator {

class MessageTable {
 public:
  using Clock = std::chrono::steady_clock;
  explicit MessageTable(int size) : size_(size) {}

  // Records `request` from `rank`, reported as ready since `since` (the tensor's age is counted
  // from its oldest report). When this completes the tensor (every rank has reported it),
  // appends its Response — a collective, or an error naming the tensor, both values and the ranks —
  // to *ready and removes it from the table. A rank reporting a name twice is an error response.
  void Add(int rank, const Request& request, Clock::time_point since, std::vector<Response>* ready);

  struct Stalled {
    std::string name;
    double waited_s = 0;
    std::vector<int> ready_ranks;
    std::vector<int> missing_ranks;
  };
  // Tensors first reported more than `after` ago and still incomplete.
  std::vector<Stalled> FindStalled(Clock::time_point now,
                                   std::chrono::duration<double> after) const;
  // Removes `name` and returns an error Response for it carrying `error`.
  Response Fail(const std::string& name, const std::string& error);

  size_t pending() const { return entries_.size(); }

 private:
  struct Entry {
    Clock::time_point first_seen;
    std::vector<bool> reported;     // by rank
    std::vector<Request> requests;  // by rank (valid where reported)
    int count = 0;
    std::string error;  // first mismatch found, if any
  };
  int size_;
  std::map<std::string, Entry> entries_;
};

// "0-3,5,7" for a sorted rank list.
std::string FormatRanks(const std::vector<int>& ranks);

}  // namespace kolo::coordinator
