#include "engine/collectives/settings_check.h"

#include <fmt/format.h>

#include <map>
#include <set>
#include <string>

#include "engine/common/crypto.h"
#include "engine/coordinator/message_table.h"

namespace kolo::collectives {
namespace {

// "name=value" lines; names and values hold no newline (the names are fixed, the values come
// from flags and numbers), and a value with one is escaped so that lines stay lines.
std::string Serialize(const std::vector<MatchedSetting>& settings) {
  std::string out;
  for (const auto& s : settings) {
    out += s.name;
    out += '=';
    for (char c : s.value) {
      if (c == '\n') {
        out += "\\n";
      } else if (c == '\\') {
        out += "\\\\";
      } else {
        out += c;
      }
    }
    out += '\n';
  }
  return out;
}

std::vector<MatchedSetting> Parse(const std::vector<uint8_t>& bytes) {
  std::vector<MatchedSetting> out;
  const std::string text(bytes.begin(), bytes.end());
  size_t at = 0;
  while (at < text.size()) {
    const size_t nl = std::min(text.find('\n', at), text.size());
    const std::string line = text.substr(at, nl - at);
    const size_t eq = std::min(line.find('='), line.size());
    out.push_back({line.substr(0, eq), eq < line.size() ? line.substr(eq + 1) : std::string()});
    at = nl + 1;
  }
  return out;
}

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace

std::string DescribeSettingMismatch(const std::vector<std::vector<MatchedSetting>>& per_rank) {
  // Setting name -> value -> ranks holding it; names in the order rank 0 lists them, then others.
  std::vector<std::string> order;
  std::map<std::string, std::map<std::string, std::vector<int>>> values;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    for (const auto& s : per_rank[r]) {
      if (!values.count(s.name)) order.push_back(s.name);
      values[s.name][s.value].push_back(static_cast<int>(r));
    }
  }
  std::vector<std::string> parts;
  for (const auto& name : order) {
    auto& by_value = values[name];
    std::set<int> holders;
    for (const auto& [value, ranks] : by_value) holders.insert(ranks.begin(), ranks.end());
    std::vector<int> missing;
    for (int r = 0; r < static_cast<int>(per_rank.size()); ++r) {
      if (!holders.count(r)) missing.push_back(r);
    }
    if (by_value.size() == 1 && missing.empty()) continue;
    std::vector<std::string> held;
    for (const auto& [value, ranks] : by_value) {
      held.push_back(fmt::format("'{}' on rank{} {}", value, ranks.size() > 1 ? "s" : "",
                                 coordinator::FormatRanks(ranks)));
    }
    if (!missing.empty()) {
      held.push_back(fmt::format("not set on rank{} {}", missing.size() > 1 ? "s" : "",
                                 coordinator::FormatRanks(missing)));
    }
    parts.push_back(fmt::format("{} is {}", name, fmt::join(held, ", ")));
  }
  if (parts.empty()) {
    // Same settings, other order: the lists were built differently (another kolo build?).
    for (size_t r = 1; r < per_rank.size(); ++r) {
      if (per_rank[r] != per_rank[0]) {
        return fmt::format(
            "ranks disagree on settings that must match: rank {} lists them in another order than "
            "rank 0 (another build of kolo?)",
            r);
      }
    }
    return "";
  }
  return fmt::format("ranks disagree on settings that must match: {}", fmt::join(parts, "; "));
}

Status CheckSettingsMatch(Comm& comm, const std::vector<MatchedSetting>& settings) {
  const std::string text = Serialize(settings);
  Sha256 h;
  h.Update(text.data(), text.size());
  const Digest mine = h.Final();
  KOLO_ASSIGN_OR_RETURN(auto digests,
                        GatherMessages(comm, 0, std::vector<uint8_t>(mine.begin(), mine.end())));
  uint8_t differ = 0;
  if (comm.rank() == 0) {
    for (const auto& d : digests) {
      if (d != std::vector<uint8_t>(mine.begin(), mine.end())) differ = 1;
    }
  }
  KOLO_ASSIGN_OR_RETURN(auto flag, BroadcastMessage(comm, 0, {differ}));
  if (flag.size() != 1)
    return ProtocolError("rank 0 sent a settings verdict of {} bytes", flag.size());
  if (flag[0] == 0) return Status::OK();
  // They differ: every rank's list, so that the error names what.
  KOLO_ASSIGN_OR_RETURN(auto lists, GatherMessages(comm, 0, Bytes(text)));
  std::string verdict;
  if (comm.rank() == 0) {
    std::vector<std::vector<MatchedSetting>> per_rank;
    for (const auto& l : lists) per_rank.push_back(Parse(l));
    verdict = DescribeSettingMismatch(per_rank);
    if (verdict.empty()) verdict = "ranks disagree on settings that must match (digests differ)";
  }
  KOLO_ASSIGN_OR_RETURN(auto answer, BroadcastMessage(comm, 0, Bytes(verdict)));
  return InvalidArgument("{}", std::string(answer.begin(), answer.end()));
}

}  // namespace kolo::collectives
