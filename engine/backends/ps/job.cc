#include "engine/backends/ps/job.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "engine/collectives/collectives.h"
#include "engine/collectives/settings_check.h"
#include "engine/transport/registry.h"

namespace kolo::backends::ps {
namespace {

// Every rank's host name, one per line, from rank 0.
std::string RootAnswer(const std::vector<std::vector<uint8_t>>& all) {
  std::string hosts(1, 'H');
  for (const auto& theirs : all) {
    hosts.append(theirs.begin(), theirs.end());
    hosts.push_back('\n');
  }
  return hosts;
}

// Checks that every rank, worker or server, has the settings that must match (MustMatch: roles,
// placement and framing among them), then gathers the host names at rank 0, which answers with
// every rank's ("H" + names, one per line).
StatusOr<std::vector<std::string>> AgreeAndListHosts(transport::Device& device, const Options& o,
                                                     std::chrono::milliseconds timeout) {
  collectives::Comm comm;
  comm.device = &device;
  comm.timeout = timeout;
  KOLO_ASSIGN_OR_RETURN(const std::string host, bootstrap::ThisHostName(o.host_name));
  KOLO_RETURN_IF_ERROR(collectives::CheckSettingsMatch(comm, MustMatch(o)));
  KOLO_ASSIGN_OR_RETURN(auto all, collectives::GatherMessages(comm, 0, {host.begin(), host.end()}));
  const std::string answer = comm.rank() == 0 ? RootAnswer(all) : std::string();
  KOLO_ASSIGN_OR_RETURN(auto reply,
                        collectives::BroadcastMessage(comm, 0, {answer.begin(), answer.end()}));
  const std::string text(reply.begin(), reply.end());
  if (text.empty() || text[0] != 'H') {
    return ProtocolError("rank 0 sent a malformed host list ({} bytes)", text.size());
  }
  std::vector<std::string> hosts;
  size_t start = 1;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    hosts.push_back(text.substr(start, nl - start));
  }
  if (static_cast<int>(hosts.size()) != o.size) {
    return ProtocolError("rank 0 listed {} hosts for a job of {} ranks", hosts.size(), o.size);
  }
  return hosts;
}

}  // namespace

std::string Roles::Describe(int launch_rank) const {
  const size_t r = static_cast<size_t>(launch_rank);
  return fmt::format("{} {} (rank {})", role[r] == Role::kServer ? "server" : "worker", index[r],
                     launch_rank);
}

Roles AssignRoles(const Options& o) {
  Roles roles;
  roles.server_ranks = o.ps_server_ranks;
  if (roles.server_ranks.empty()) {
    for (int r = o.size - o.ps_servers; r < o.size; ++r) roles.server_ranks.push_back(r);
  }
  roles.role.assign(static_cast<size_t>(o.size), Role::kWorker);
  roles.index.assign(static_cast<size_t>(o.size), 0);
  for (size_t j = 0; j < roles.server_ranks.size(); ++j) {
    const size_t r = static_cast<size_t>(roles.server_ranks[j]);
    roles.role[r] = Role::kServer;
    roles.index[r] = static_cast<int>(j);
  }
  for (int r = 0; r < o.size; ++r) {
    if (roles.role[static_cast<size_t>(r)] == Role::kWorker) {
      roles.index[static_cast<size_t>(r)] = roles.workers();
      roles.worker_ranks.push_back(r);
    }
  }
  return roles;
}

std::vector<int> PlanJobConnections(int rank, const Roles& roles, int direct_max_ranks) {
  const int size = static_cast<int>(roles.role.size());
  std::vector<int> peers;
  const auto& other = roles.role[static_cast<size_t>(rank)] == Role::kWorker ? roles.server_ranks
                                                                             : roles.worker_ranks;
  peers.insert(peers.end(), other.begin(), other.end());
  if (size <= direct_max_ranks) {
    if (rank == 0) {
      for (int r = 1; r < size; ++r) peers.push_back(r);
    } else {
      peers.push_back(0);
    }
  } else {
    for (int mask = 1; mask < size; mask <<= 1) {
      if ((rank ^ mask) < size) peers.push_back(rank ^ mask);
    }
  }
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  peers.erase(std::remove(peers.begin(), peers.end(), rank), peers.end());
  return peers;
}

StatusOr<Job> Join(const Options& options, bootstrap::Store* external) {
  Job job;
  job.options = options;
  job.roles = AssignRoles(options);
  job.role = job.roles.role[static_cast<size_t>(options.rank)];
  job.index = job.roles.index[static_cast<size_t>(options.rank)];
  KOLO_ASSIGN_OR_RETURN(job.policy, ParsePlacementPolicy(options.ps_placement));
  KOLO_ASSIGN_OR_RETURN(job.rendezvous, bootstrap::StartRendezvous(options, external));

  transport::ConnectSettings link =
      transport::SettingsFrom(options, job.rendezvous.listen_addr, job.rendezvous.secret);
  // Only the pairs the job uses: workers with servers, and start-up's gather and broadcast.
  link.peers =
      PlanJobConnections(options.rank, job.roles, collectives::Comm{}.bitwise_direct_max_ranks);
  bootstrap::PrefixStore ps_store("ps/", *job.rendezvous.store);
  auto device = transport::Connect(options.transport, link, ps_store, options.rank, options.size);
  if (!device.ok()) {
    return device.status().WithContext(
        fmt::format("{}: connecting the parameter-server job", job.roles.Describe(options.rank)));
  }
  job.device = std::move(device).value();
  // Ranks may still be in their own set-up, bounded by the same timeout from their own start
  // (with a server that stopped, say). The agreement waits twice as long, so that such a rank's
  // failure (naming the rank it could not reach) arrives before rank 0 gives up on it and blames
  // its silence instead.
  KOLO_ASSIGN_OR_RETURN(auto hosts, AgreeAndListHosts(*job.device, options, 2 * link.timeout));
  job.hosts = bootstrap::HostLayout(hosts);

  if (job.role == Role::kWorker) {
    Options& w = job.worker_options;
    w = options;
    w.rank = job.index;
    w.size = job.roles.workers();
    w.local_rank = 0;
    w.local_size = 0;
    const std::string& mine = hosts[static_cast<size_t>(options.rank)];
    for (int r : job.roles.worker_ranks) {
      if (hosts[static_cast<size_t>(r)] != mine) continue;
      if (r < options.rank) ++w.local_rank;
      ++w.local_size;
    }
    job.worker_store = std::make_unique<bootstrap::PrefixStore>("workers/", *job.rendezvous.store);
    if (options.ps_pacing_bits_per_s > 0) {
      // Pushes go out paced on every connection to a server that crosses a wire; shared memory
      // within a host has none to pace.
      for (int server : job.roles.server_ranks) {
        if (std::string(job.device->pair_transport(server)) == "shm") continue;
        Status s = job.device->pair(server).PaceSends(options.ps_pacing_bits_per_s / 8);
        if (!s.ok()) {
          return s.WithContext(fmt::format("{}: pacing its pushes at {} (KOLO_PS_PACING)",
                                           job.roles.Describe(options.rank),
                                           FormatBitRate(options.ps_pacing_bits_per_s)));
        }
      }
    }
  }
  return job;
}

}  // namespace kolo::backends::ps
