// Which host each rank runs on, as the ranks of a job agree on it: every rank publishes its host
// name in the rendezvous store and reads everyone's. Ranks with the same name share a host. The
// shared-memory transport connects the ranks of one host, hierarchical allreduce groups by host,
// and errors name a lost rank's host.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "engine/bootstrap/store.h"
#include "engine/common/status.h"

namespace kolo::bootstrap {

class HostLayout {
 public:
  HostLayout() = default;
  // From every rank's host name, in rank order. Hosts are numbered by their lowest rank.
  explicit HostLayout(const std::vector<std::string>& name_of_rank);

  // Whether the layout is known (built from the job's names); an empty layout knows no rank.
  bool known() const { return !host_of_.empty(); }
  int size() const { return static_cast<int>(host_of_.size()); }
  int num_hosts() const { return static_cast<int>(names_.size()); }
  // REQUIRES: 0 <= rank < size().
  int host(int rank) const { return host_of_[static_cast<size_t>(rank)]; }
  const std::string& host_name(int host) const { return names_[static_cast<size_t>(host)]; }
  // The ranks on `host`, ascending.
  const std::vector<int>& ranks_on(int host) const { return ranks_[static_cast<size_t>(host)]; }
  // Position of `rank` among the ranks of its host.
  int local_index(int rank) const { return local_index_[static_cast<size_t>(rank)]; }
  bool same_host(int a, int b) const { return host(a) == host(b); }
  // Every host has the same number of ranks.
  bool uniform() const;
  // The rank at `rank`'s local index on every host, in host order. REQUIRES: uniform().
  std::vector<int> CrossGroup(int rank) const;
  // "rank 3 (host h1)"; "rank 3" when the layout is not known.
  std::string Describe(int rank) const;
  // "h0: ranks 0-1, h1: ranks 2-3"-style summary, one entry per host.
  std::string Summary() const;
  // `text` (an error message) with the hosts of the ranks it names ("rank N") appended, e.g.
  // "... lost: reset [rank 2 is on host h2]", when the job spans several hosts; `text` unchanged
  // otherwise, or when it names no rank of the job.
  std::string NameHosts(const std::string& text) const;

 private:
  std::vector<int> host_of_;
  std::vector<int> local_index_;
  std::vector<std::string> names_;
  std::vector<std::vector<int>> ranks_;
};

// The name this rank's host goes by: `configured` (Options::host_name, KOLO_HOST_NAME) when set,
// else the system's host name.
StatusOr<std::string> ThisHostName(const std::string& configured);

// Publishes "host/<rank>" = `host_name` in `store` and reads every rank's; waits at most `timeout`
// for the slowest (DeadlineExceeded names the ranks missing). A host name must be 1..255
// printable characters without spaces.
StatusOr<HostLayout> ExchangeHostLayout(Store& store, const std::string& host_name, int rank,
                                        int size, std::chrono::milliseconds timeout);

}  // namespace kolo::bootstrap
