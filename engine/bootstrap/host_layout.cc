#include "engine/bootstrap/host_layout.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <map>
#include <string_view>

namespace kolo::bootstrap {
namespace {

Status CheckHostName(const std::string& name) {
  if (name.empty() || name.size() > 255) {
    return InvalidArgument("host name '{}' must have 1 to 255 characters", name);
  }
  for (char c : name) {
    if (c <= ' ' || c > '~') {
      return InvalidArgument("host name '{}' has a space or a non-printable character", name);
    }
  }
  return Status::OK();
}

// "0-3,5" for ascending ranks.
std::string RankRanges(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace

HostLayout::HostLayout(const std::vector<std::string>& name_of_rank) {
  std::map<std::string, int> index;
  for (size_t r = 0; r < name_of_rank.size(); ++r) {
    auto [it, added] = index.emplace(name_of_rank[r], static_cast<int>(names_.size()));
    if (added) {
      names_.push_back(name_of_rank[r]);
      ranks_.emplace_back();
    }
    host_of_.push_back(it->second);
    local_index_.push_back(static_cast<int>(ranks_[static_cast<size_t>(it->second)].size()));
    ranks_[static_cast<size_t>(it->second)].push_back(static_cast<int>(r));
  }
}

bool HostLayout::uniform() const {
  return std::all_of(ranks_.begin(), ranks_.end(),
                     [&](const std::vector<int>& r) { return r.size() == ranks_[0].size(); });
}

std::vector<int> HostLayout::CrossGroup(int rank) const {
  std::vector<int> group;
  for (const std::vector<int>& on_host : ranks_) {
    group.push_back(on_host[static_cast<size_t>(local_index(rank))]);
  }
  return group;
}

std::string HostLayout::Describe(int rank) const {
  if (rank < 0 || rank >= size()) return fmt::format("rank {}", rank);
  return fmt::format("rank {} (host {})", rank, host_name(host(rank)));
}

std::string HostLayout::Summary() const {
  std::string out;
  for (int h = 0; h < num_hosts(); ++h) {
    if (!out.empty()) out += ", ";
    const auto& r = ranks_on(h);
    out += fmt::format("{}: rank{} {}", host_name(h), r.size() == 1 ? "" : "s", RankRanges(r));
  }
  return out;
}

std::string HostLayout::NameHosts(const std::string& text) const {
  if (num_hosts() < 2) return text;
  std::vector<int> named;
  static constexpr std::string_view kRank = "rank ";
  for (size_t at = text.find(kRank); at != std::string::npos; at = text.find(kRank, at + 1)) {
    // A whole word "rank" followed by a number.
    if (at > 0 && std::isalnum(static_cast<unsigned char>(text[at - 1]))) continue;
    size_t end = at + kRank.size();
    int value = 0;
    bool digits = false;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end])) &&
           value < (1 << 24)) {
      value = value * 10 + (text[end++] - '0');
      digits = true;
    }
    if (!digits || value >= size()) continue;
    if (std::find(named.begin(), named.end(), value) == named.end()) named.push_back(value);
  }
  if (named.empty()) return text;
  std::string hosts;
  for (int r : named) {
    hosts +=
        fmt::format("{}rank {} is on host {}", hosts.empty() ? "" : ", ", r, host_name(host(r)));
  }
  return fmt::format("{} [{}]", text, hosts);
}

StatusOr<std::string> ThisHostName(const std::string& configured) {
  if (!configured.empty()) {
    KOLO_RETURN_IF_ERROR(CheckHostName(configured));
    return configured;
  }
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "gethostname", errno);
  }
  std::string name(host);
  KOLO_RETURN_IF_ERROR(CheckHostName(name));
  return name;
}

StatusOr<HostLayout> ExchangeHostLayout(Store& store, const std::string& host_name, int rank,
                                        int size, std::chrono::milliseconds timeout) {
  KOLO_RETURN_IF_ERROR(CheckHostName(host_name));
  if (rank < 0 || rank >= size) {
    return InvalidArgument("host layout: rank {} is outside [0, {})", rank, size);
  }
  KOLO_RETURN_IF_ERROR(
      store.Set(fmt::format("host/{}", rank), {host_name.begin(), host_name.end()}));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> names(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    const auto left = std::max(std::chrono::milliseconds(0),
                               std::chrono::duration_cast<std::chrono::milliseconds>(
                                   deadline - std::chrono::steady_clock::now()));
    auto value = store.Get(fmt::format("host/{}", r), left);
    if (!value.ok()) {
      return value.status().WithContext(
          fmt::format("rank {}: waiting for the host name of rank {} (ranks {}..{} not read yet)",
                      rank, r, r, size - 1));
    }
    std::string name(value->begin(), value->end());
    Status ok = CheckHostName(name);
    if (!ok.ok()) return ok.WithContext(fmt::format("the host name rank {} published", r));
    names[static_cast<size_t>(r)] = std::move(name);
  }
  return HostLayout(names);
}

}  // namespace kolo::bootstrap
