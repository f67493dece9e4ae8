#include "engine/coordinator/message_table.h"

#include <fmt/format.h>

#include <algorithm>

namespace kolo::coordinator {

std::string FormatRanks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j > i + 1 ? fmt::format("{}-{}", ranks[i], ranks[j])
                     : (j == i + 1 ? fmt::format("{},{}", ranks[i], ranks[j])
                                   : fmt::format("{}", ranks[i]));
    i = j + 1;
  }
  return out;
}

void MessageTable::Add(int rank, const Request& request, Clock::time_point since,
                       std::vector<Response>* ready) {
  auto [it, inserted] = entries_.try_emplace(request.name);
  Entry& e = it->second;
  if (inserted) {
    e.first_seen = since;
    e.reported.assign(size_, false);
    e.requests.resize(size_);
  } else {
    e.first_seen = std::min(e.first_seen, since);
  }
  if (e.reported[rank]) {
    if (e.error.empty()) {
      e.error =
          fmt::format("'{}': rank {} submitted it twice before it completed", request.name, rank);
    }
  } else {
    e.reported[rank] = true;
    e.requests[rank] = request;
    ++e.count;
    if (e.error.empty()) {
      // Compare with the lowest rank that reported so far.
      for (int r = 0; r < size_; ++r) {
        if (r == rank || !e.reported[r]) continue;
        if (!e.requests[r].Compatible(request)) {
          e.error = fmt::format("{} '{}': rank {} sent {}, rank {} sent {}",
                                CollectiveTypeName(e.requests[r].type), request.name, rank,
                                request.Describe(), r, e.requests[r].Describe());
        }
        break;
      }
    }
  }
  if (e.count < size_) return;

  Response resp;
  resp.request = e.requests[0];
  if (!e.error.empty()) {
    resp.kind = Response::Kind::kError;
    resp.error = e.error;
  } else if (resp.request.type == CollectiveType::kAllgather) {
    for (int r = 0; r < size_; ++r) resp.first_dims.push_back(e.requests[r].shape[0]);
  }
  ready->push_back(std::move(resp));
  entries_.erase(it);
}

std::vector<MessageTable::Stalled> MessageTable::FindStalled(
    Clock::time_point now, std::chrono::duration<double> after) const {
  std::vector<Stalled> out;
  for (const auto& [name, e] : entries_) {
    const std::chrono::duration<double> waited = now - e.first_seen;
    if (waited <= after) continue;
    Stalled s;
    s.name = name;
    s.waited_s = waited.count();
    for (int r = 0; r < size_; ++r) (e.reported[r] ? s.ready_ranks : s.missing_ranks).push_back(r);
    out.push_back(std::move(s));
  }
  return out;
}

Response MessageTable::Fail(const std::string& name, const std::string& error) {
  Response resp;
  resp.kind = Response::Kind::kError;
  auto it = entries_.find(name);
  if (it != entries_.end()) {
    for (int r = 0; r < size_; ++r) {
      if (it->second.reported[r]) {
        resp.request = it->second.requests[r];
        break;
      }
    }
    entries_.erase(it);
  }
  resp.request.name = name;
  resp.error = error;
  return resp;
}

}  // namespace kolo::coordinator
