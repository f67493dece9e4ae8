#include "engine/transport/transport.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

namespace kolo::transport {

Status WaitFor(Device& device, size_t expected, std::vector<Completion>* out,
               std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  const size_t target = out->size() + expected;
  while (out->size() < target) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    Status s = device.Poll(out, std::max(left, std::chrono::milliseconds(0)));
    if (s.code() == StatusCode::kDeadlineExceeded) {
      return s.WithContext(fmt::format("waited {} ms for {} completion(s), got {}", timeout.count(),
                                       expected, expected - (target - out->size())));
    }
    KOLO_RETURN_IF_ERROR(s);
  }
  return Status::OK();
}

Status UnconnectedPair::Fail() const {
  return FailedPrecondition(
      "rank {} has no {} connection to rank {}: the job's connection plan does not connect them "
      "(a collective asked for a peer its algorithm does not use)",
      rank_, transport_, peer_);
}

int Device::connections() const {
  int n = 0;
  for (int peer = 0; peer < size(); ++peer) n += connected(peer) ? 1 : 0;
  return n;
}

std::string PairTransports(const Device& device) {
  std::vector<std::string> names;
  for (int peer = 0; peer < device.size(); ++peer) {
    if (!device.connected(peer)) continue;
    std::string name = device.pair_transport(peer);
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  if (names.empty()) return "none";
  std::sort(names.begin(), names.end());
  return fmt::format("{}", fmt::join(names, "+"));
}

std::vector<int> SilentPeers(const Device& device, std::chrono::milliseconds threshold) {
  std::vector<std::pair<double, int>> silent;
  const double at_least = std::chrono::duration<double>(threshold).count();
  for (int peer = 0; peer < device.size(); ++peer) {
    const double s = device.SilentSeconds(peer);
    if (s >= at_least) silent.emplace_back(s, peer);
  }
  std::sort(silent.begin(), silent.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<int> peers;
  for (const auto& [s, peer] : silent) peers.push_back(peer);
  return peers;
}

std::string DescribeSilentPeers(const Device& device, std::chrono::milliseconds threshold) {
  std::string text;
  for (int peer : SilentPeers(device, threshold)) {
    text +=
        fmt::format("{}rank {} {}{:.1f} s", text.empty() ? "" : ", ", peer,
                    text.empty() ? "has sent nothing for " : "for ", device.SilentSeconds(peer));
  }
  if (!text.empty()) text += " (stopped, hung or unreachable)";
  return text;
}

}  // namespace kolo::transport
