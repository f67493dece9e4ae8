#include "engine/coordinator/controller.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "engine/common/fault_inject.h"
#include "engine/common/logging.h"

namespace kolo::coordinator {
namespace {

// The bit vector of one exchange, W = the cache's words: ANDed, the hit bits [0, W), the step
// check [W, W+2) and the shutdown word (W+2); ORed, the flags word (W+3), the invalidated bits
// [W+4, 2W+4), the hit bits again [2W+4, 3W+4), the step check again [3W+4, 3W+6) and the shutdown
// word again (3W+6). Words sent twice, ANDed and ORed, agree exactly when every rank sent the same:
// the step check, and the shutdown word (the rank that asks to shut down sends its rank, the
// others all ones in the AND and zero in the OR), which names the rank when only one asked.
struct Layout {
  static constexpr size_t kCheckWords = 2;
  static constexpr size_t kTwice = kCheckWords + 1;  // words sent in both blocks
  size_t w;
  size_t and_check() const { return w; }
  size_t and_shut() const { return w + kCheckWords; }
  size_t flags() const { return w + kTwice; }
  size_t invalid() const { return w + kTwice + 1; }
  size_t or_hits() const { return 2 * w + kTwice + 1; }
  size_t or_check() const { return 3 * w + kTwice + 1; }
  size_t or_shut() const { return 3 * w + kTwice + 1 + kCheckWords; }
  size_t and_words() const { return w + kTwice; }
  size_t or_words() const { return 2 * w + kTwice + 1; }
  size_t total() const { return 3 * w + 2 * kTwice + 1; }
};

constexpr uint64_t kFlagUncached = 1;  // some rank has requests for the coordinator
constexpr uint64_t kFlagShutdown = 2;  // some rank asked to shut down

class SteadySystemClock final : public Clock {
 public:
  SteadyClock::time_point Now() override { return SteadyClock::now(); }
};

SteadyClock::duration HitStallAfter(const ControllerSettings& s) {
  double seconds = s.stall_warning_s;
  if (s.stall_shutdown_s > 0 && (seconds <= 0 || s.stall_shutdown_s < seconds)) {
    seconds = s.stall_shutdown_s;
  }
  return std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

Clock& SystemClock() {
  static SteadySystemClock clock;
  return clock;
}

Controller::Controller(const ControllerSettings& settings, Peers& peers, Clock& clock)
    : settings_(settings),
      peers_(peers),
      clock_(clock),
      hit_stall_after_(HitStallAfter(settings)),
      cache_(settings.cache_capacity),
      bits_(Layout{cache_.words()}.total(), 0),
      last_stall_check_(clock.Now()) {
  if (settings.rank == 0) table_.emplace(settings.size);
}

size_t Controller::ExchangeWords(const ControllerSettings& settings) {
  return Layout{ResponseCache::WordsFor(settings.cache_capacity)}.total();
}

void Controller::Release(PendingMap::iterator it) {
  constexpr size_t kMaxSpare = 4096;
  if (spare_.size() < kMaxSpare) {
    spare_.push_back(pending_.extract(it));
  } else {
    pending_.erase(it);
  }
}

void Controller::Add(const Request& request, SteadyClock::time_point submitted) {
  Entry* added;
  if (spare_.empty()) {
    added = &pending_.try_emplace(request.name).first->second;
    added->request = request;
  } else {
    PendingMap::node_type node = std::move(spare_.back());
    spare_.pop_back();
    node.key() = request.name;
    node.mapped().request = request;  // reuses the old request's string and shape capacity
    added = &pending_.insert(std::move(node)).position->second;
  }
  Entry& entry = *added;
  entry.submitted = submitted;
  entry.order = next_order_++;
  entry.cache_bit = -1;
  fresh_ = true;
  int bit = -1;
  const Layout at{cache_.words()};
  switch (settings_.size > 1 ? cache_.Find(request, settings_.rank, &bit)
                             : ResponseCache::Lookup::kMiss) {
    case ResponseCache::Lookup::kHit:
      entry.cache_bit = bit;
      // Another rank already offered this tensor in the last exchange: it waits on this rank.
      if (!awaited_.empty() && (awaited_[static_cast<size_t>(bit) / 64] >> (bit % 64) & 1) != 0) {
        urgent_ = true;
      }
      break;
    case ResponseCache::Lookup::kMismatch:
      // Set in this cycle's invalid vector: every rank drops the entry and renegotiates.
      bits_[at.invalid() + static_cast<size_t>(bit) / 64] |= uint64_t{1} << (bit % 64);
      unreported_.push_back(request.name);
      break;
    case ResponseCache::Lookup::kMiss:
      unreported_.push_back(request.name);
      if (others_reported_) urgent_ = true;
      break;
  }
}

bool Controller::HasNews(SteadyClock::time_point now) const {
  if (fresh_ || !unreported_.empty()) return true;
  if (now >= hit_stall_due_) return true;
  return table_ && table_->pending() > 0 && now - last_stall_check_ > kStallCheckEvery;
}

SteadyClock::time_point Controller::NextDue() const {
  SteadyClock::time_point due = hit_stall_due_;
  if (table_ && table_->pending() > 0) due = std::min(due, last_stall_check_ + kStallCheckEvery);
  return due;
}

void Controller::UpdateHitStallDue() {
  hit_stall_due_ = SteadyClock::time_point::max();
  if (hit_stall_after_ <= SteadyClock::duration::zero()) return;
  for (const auto& [name, entry] : pending_) {
    if (entry.cache_bit >= 0) {
      hit_stall_due_ = std::min(hit_stall_due_, entry.submitted + hit_stall_after_);
    }
  }
}

void Controller::Clear() {
  pending_.clear();
  unreported_.clear();
  fresh_ = urgent_ = others_reported_ = false;
  awaited_.clear();
  std::fill(bits_.begin(), bits_.end(), 0);
  hit_stall_due_ = SteadyClock::time_point::max();
}

Status Controller::Negotiate(bool shutdown, std::vector<Response>* responses, bool* stop,
                             NegotiationStats* stats) {
  const auto start = clock_.Now();
  const size_t words = cache_.words();
  const Layout at{words};
  const size_t first_new = responses->size();
  *stats = NegotiationStats{};
  if (settings_.size == 1) {
    // Nothing to agree on: everything added is ready, in the order it was added.
    std::vector<const Entry*> ready;
    for (const auto& [name, entry] : pending_) ready.push_back(&entry);
    std::sort(ready.begin(), ready.end(), [](auto* a, auto* b) { return a->order < b->order; });
    for (const Entry* e : ready) {
      Response r;
      r.request = e->request;
      if (r.request.type == CollectiveType::kAllgather) r.first_dims = {e->request.shape[0]};
      responses->push_back(std::move(r));
    }
    while (!pending_.empty()) Release(pending_.begin());
    unreported_.clear();
    fresh_ = urgent_ = false;
    std::fill(bits_.begin(), bits_.end(), 0);
    *stop = shutdown;
    if (shutdown) shut_down_by_ = settings_.rank;
    return Status::OK();
  }

  // One bit-vector exchange: AND of cache hits | OR of flags | OR of invalidated bits. A hit that
  // has waited past the stall time is invalidated instead: every rank drops the entry, and the
  // ranks that have the tensor report it to the coordinator, whose stall inspector then names
  // the ranks missing it.
  // ... | OR of cache hits: what some rank offered, for the ranks that have not submitted it yet.
  fresh_ = false;
  urgent_ = false;
  bool handed_back = false;
  for (const auto& [name, entry] : pending_) {
    if (entry.cache_bit < 0) continue;
    const uint64_t mask = uint64_t{1} << (entry.cache_bit % 64);
    const size_t word = static_cast<size_t>(entry.cache_bit) / 64;
    if (hit_stall_after_ > SteadyClock::duration::zero() &&
        start - entry.submitted >= hit_stall_after_) {
      bits_[at.invalid() + word] |= mask;
      handed_back = true;
    } else {
      bits_[word] |= mask;
      bits_[at.or_hits() + word] |= mask;
    }
  }
  const bool rank0_round =
      table_ && table_->pending() > 0 && start - last_stall_check_ > kStallCheckEvery;
  const bool reporting = !unreported_.empty();
  if (reporting || rank0_round || handed_back) bits_[at.flags()] |= kFlagUncached;
  if (shutdown) bits_[at.flags()] |= kFlagShutdown;
  bits_[at.and_shut()] = shutdown ? static_cast<uint64_t>(settings_.rank) : ~uint64_t{0};
  bits_[at.or_shut()] = shutdown ? static_cast<uint64_t>(settings_.rank) : 0;
  // The step check: which exchange this is and what this rank has agreed so far (every response
  // it was handed, and its cache, from which this exchange's hits are read). Ranks that differ
  // would run different collectives; they stop here, before running any.
  if (FaultPoint(FaultPointId::kNegotiate, settings_.rank)) history_ ^= 1;  // tests only
  const uint64_t check[Layout::kCheckWords] = {exchanges_,
                                               MixFingerprint(history_, cache_.digest())};
  for (size_t i = 0; i < Layout::kCheckWords; ++i) {
    bits_[at.and_check() + i] = bits_[at.or_check() + i] = check[i];
  }
  // Riding: this rank's news is only hits; their data goes with the words.
  RidingPayload payload;
  bool offering = false;
  const size_t riding_max = riding_ ? peers_.RidingMaxBytes() : 0;
  if (riding_max > 0 && !reporting && !rank0_round && !handed_back && !shutdown &&
      !pending_.empty()) {
    riding_hits_.clear();
    for (size_t w = 0; w < words; ++w) {
      for (uint64_t m = bits_[w]; m != 0; m &= m - 1) {
        const int bit = static_cast<int>(w * 64 + static_cast<size_t>(__builtin_ctzll(m)));
        riding_hits_.push_back(&cache_.Get(bit).request);
      }
    }
    payload.data = peers_.RidingSpace();
    offering = !riding_hits_.empty() && riding_(riding_hits_, riding_max, &payload);
    if (offering) {
      riding_offered_.assign(bits_.begin(), bits_.begin() + static_cast<ptrdiff_t>(words));
    } else {
      payload = RidingPayload{};
    }
  }
  if (riding_max > 0) {
    KOLO_RETURN_IF_ERROR(
        peers_.BitwiseAllreduceRiding(bits_.data(), at.and_words(), at.or_words(), &payload));
  } else {
    KOLO_RETURN_IF_ERROR(peers_.BitwiseAllreduce(bits_.data(), at.and_words(), at.or_words()));
  }
  ++exchanges_;
  for (size_t i = 0; i < Layout::kCheckWords; ++i) {
    if (bits_[at.and_check() + i] != bits_[at.or_check() + i]) return OutOfStep(check);
  }
  *stop = (bits_[at.flags()] & kFlagShutdown) != 0;
  if (*stop) {
    shut_down_by_ = bits_[at.and_shut()] == bits_[at.or_shut()]
                        ? static_cast<int>(bits_[at.or_shut()])
                        : kSeveralRanks;
  }
  const bool uncached = (bits_[at.flags()] & kFlagUncached) != 0;
  // The payload is the agreed responses' sum when every rank offered exactly these hits (AND and
  // OR of the offers equal to this rank's) and nothing else happens in this exchange.
  if (payload.summed && offering && !uncached && !*stop) {
    bool same = true;
    for (size_t w = 0; w < words && same; ++w) {
      same = bits_[w] == riding_offered_[w] && bits_[at.or_hits() + w] == riding_offered_[w] &&
             bits_[at.invalid() + w] == 0;
    }
    stats->riding = same;
  }
  // Offered somewhere, agreed nowhere, not invalidated: a rank that submits one of these next
  // completes (or comes closer to completing) a collective its peers already wait for, and starts
  // the next exchange at once instead of on its cycle grid. Likewise a rank with a request to
  // report after a round in which others reported theirs.
  awaited_.assign(words, 0);
  for (size_t w = 0; w < words; ++w) {
    awaited_[w] = bits_[at.or_hits() + w] & ~bits_[w] & ~bits_[at.invalid() + w];
  }
  others_reported_ = uncached && !reporting;

  // Invalidated entries: every rank drops them and renegotiates any pending use.
  for (size_t w = 0; w < words; ++w) {
    for (uint64_t m = bits_[at.invalid() + w]; m != 0; m &= m - 1) {
      const int bit = static_cast<int>(w * 64 + static_cast<size_t>(__builtin_ctzll(m)));
      for (auto& [name, entry] : pending_) {
        if (entry.cache_bit == bit) {
          entry.cache_bit = -1;
          unreported_.push_back(name);
        }
      }
      cache_.Erase(bit);
      bits_[w] &= ~(uint64_t{1} << (bit % 64));
    }
  }
  // Hits on every rank, in bit order (the same on every rank).
  for (size_t w = 0; w < words; ++w) {
    for (uint64_t m = bits_[w]; m != 0; m &= m - 1) {
      const int bit = static_cast<int>(w * 64 + static_cast<size_t>(__builtin_ctzll(m)));
      responses->push_back(cache_.Get(bit));
      // The cache keeps each entry's fingerprint: a steady step hashes no names.
      history_ = MixFingerprint(history_, cache_.fingerprint(bit));
      cache_.Touch(bit);
      ++stats->cache_hits;
    }
  }
  std::fill(bits_.begin(), bits_.end(), 0);
  // A tensor agreed here is done (a hit is pending on every rank, this one included).
  for (size_t i = first_new; i < responses->size(); ++i) {
    auto it = pending_.find((*responses)[i].request.name);
    if (it != pending_.end()) Release(it);
  }

  if (uncached) {
    const size_t cached = responses->size();
    KOLO_RETURN_IF_ERROR(CoordinatorRound(responses));
    ++stats->rounds;
    // Newly agreed collectives enter the cache in list order — the same on every rank. An
    // eviction may take the bit of a tensor still waiting as a hit: it renegotiates.
    for (size_t i = cached; i < responses->size(); ++i) {
      history_ = MixFingerprint(history_, Fingerprint((*responses)[i]));
      if (!(*responses)[i].is_error()) cache_.Put((*responses)[i]);
    }
    for (auto& [name, entry] : pending_) {
      if (entry.cache_bit >= 0 &&
          (!cache_.Occupied(entry.cache_bit) || cache_.Get(entry.cache_bit).request.name != name)) {
        entry.cache_bit = -1;
        unreported_.push_back(name);
      }
    }
    // Tensors the coordinator agreed are done here (errors may name tensors this rank never
    // added).
    for (size_t i = cached; i < responses->size(); ++i) {
      auto it = pending_.find((*responses)[i].request.name);
      if (it != pending_.end()) Release(it);
    }
  }
  // What this rank was handed, in order, for the next exchange's step check (the hits were
  // folded in above, from the cache).
  agreed_ += static_cast<int64_t>(responses->size() - first_new);
  if (responses->size() > first_new) last_agreed_ = responses->back().request.name;
  UpdateHitStallDue();
  for (size_t i = first_new; i < responses->size(); ++i) {
    if ((*responses)[i].kind == Response::Kind::kFatal) {
      failed_everywhere_ = true;
      return DeadlineExceeded("{}", (*responses)[i].error);
    }
  }
  return Status::OK();
}

Status Controller::OutOfStep(const uint64_t (&check)[2]) {
  // Every rank saw the same AND and OR, so every rank is here, in this exchange: one more round,
  // on this error path only, tells rank 0 what each rank has agreed, so that the error names them.
  const std::string mine =
      fmt::format("{} {:016x} {} {}", check[0], check[1], agreed_, last_agreed_);
  std::string verdict;
  auto all = peers_.GatherAtRoot({mine.begin(), mine.end()});
  if (!all.ok()) return all.status().WithContext("ranks are out of step; asking which");
  if (settings_.rank == 0) {
    // Ranks grouped by what they sent.
    std::map<std::string, std::vector<int>> groups;
    for (size_t r = 0; r < all->size(); ++r) {
      groups[std::string((*all)[r].begin(), (*all)[r].end())].push_back(static_cast<int>(r));
    }
    std::vector<std::string> parts;
    for (const auto& [text, ranks] : groups) {
      // "<exchange> <digest> <agreed> <last name>"
      std::vector<std::string> f;
      size_t at = 0;
      for (int i = 0; i < 3; ++i) {
        const size_t sp = std::min(text.find(' ', at), text.size());
        f.push_back(text.substr(at, sp - at));
        at = std::min(sp + 1, text.size());
      }
      parts.push_back(fmt::format("rank{} {}: exchange {}, {} agreed, the last '{}' (history {})",
                                  ranks.size() > 1 ? "s" : "", FormatRanks(ranks), f[0],
                                  f[2] == "1" ? "1 collective" : f[2] + " collectives",
                                  text.substr(at), f[1]));
    }
    verdict = fmt::format(
        "ranks are out of step: they would run different collectives ({}). Every rank must "
        "submit the same tensors in a compatible order; a difference that passed negotiation is a "
        "bug: please report it",
        fmt::join(parts, "; "));
  }
  auto answer = peers_.BroadcastFromRoot({verdict.begin(), verdict.end()});
  if (!answer.ok()) {
    // Rank 0 fails as soon as it has sent the verdict, and its abort may overtake the broadcast
    // (an abort passes unread messages): the abort then carries the verdict, which every rank
    // reports alike.
    const std::string& m = answer.status().message();
    const size_t at = m.find("ranks are out of step: ");
    if (at != std::string::npos) {
      failed_everywhere_ = true;
      return FailedPrecondition("{}", m.substr(at));
    }
    return answer.status().WithContext("ranks are out of step; asking which");
  }
  failed_everywhere_ = true;
  return FailedPrecondition("{}", std::string(answer->begin(), answer->end()));
}

Status Controller::CoordinatorRound(std::vector<Response>* responses) {
  RequestList mine;
  const auto sent = clock_.Now();
  for (const std::string& name : unreported_) {
    auto it = pending_.find(name);
    if (it != pending_.end() && it->second.cache_bit < 0) {
      mine.requests.push_back(it->second.request);
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(sent - it->second.submitted);
      mine.waited_ms.push_back(static_cast<uint32_t>(
          std::clamp<int64_t>(waited.count(), 0, std::numeric_limits<uint32_t>::max())));
    }
  }
  unreported_.clear();
  KOLO_ASSIGN_OR_RETURN(auto gathered, peers_.GatherAtRoot(Serialize(mine)));
  std::vector<uint8_t> answer;
  if (settings_.rank == 0) {
    ResponseList list;
    const auto now = clock_.Now();
    for (int r = 0; r < settings_.size; ++r) {
      auto parsed = ParseRequestList(gathered[static_cast<size_t>(r)]);
      if (!parsed.ok()) return parsed.status().WithContext(fmt::format("requests from rank {}", r));
      for (size_t i = 0; i < parsed->requests.size(); ++i) {
        const auto since = now - std::chrono::milliseconds(parsed->waited_ms[i]);
        table_->Add(r, parsed->requests[i], since, &list.responses);
      }
    }
    InspectStalls(now, &list.responses);
    answer = Serialize(list);
  }
  KOLO_ASSIGN_OR_RETURN(answer, peers_.BroadcastFromRoot(answer));
  KOLO_ASSIGN_OR_RETURN(auto list, ParseResponseList(answer));
  for (Response& r : list.responses) responses->push_back(std::move(r));
  return Status::OK();
}

void Controller::InspectStalls(SteadyClock::time_point now, std::vector<Response>* errors) {
  last_stall_check_ = now;
  if (settings_.stall_warning_s > 0) {
    // One line per set of missing ranks, not one per tensor: a rank that stopped leaves every
    // tensor of a step waiting (hundreds), and the line should name it, not flood the log.
    const auto warn_after = std::chrono::duration<double>(settings_.stall_warning_s);
    std::map<std::pair<std::vector<int>, std::vector<int>>, std::vector<MessageTable::Stalled>>
        groups;
    for (auto& s : table_->FindStalled(now, warn_after)) {
      auto& last = stall_warned_[s.name];
      if (last != SteadyClock::time_point{} && now - last < warn_after) continue;
      last = now;
      groups[{s.ready_ranks, s.missing_ranks}].push_back(std::move(s));
    }
    for (const auto& [ranks, stalled] : groups) {
      constexpr size_t kNamed = 3;
      std::vector<std::string> names;
      double longest = 0;
      for (const auto& s : stalled) {
        if (names.size() < kNamed) names.push_back(fmt::format("'{}'", s.name));
        longest = std::max(longest, s.waited_s);
      }
      const std::string more =
          stalled.size() > kNamed ? fmt::format(" and {} more", stalled.size() - kNamed) : "";
      KOLO_LOG(kWarning,
               "stalled: {} tensor{} ({}{}) waited up to {:.1f} s: ready on ranks {}, missing on "
               "ranks {}. Every rank must submit the same tensors{}.",
               stalled.size(), stalled.size() > 1 ? "s" : "", fmt::join(names, ", "), more, longest,
               FormatRanks(ranks.first), FormatRanks(ranks.second),
               settings_.stall_shutdown_s > 0
                   ? fmt::format("; they fail at {:g} s (KOLO_STALL_SHUTDOWN_SECONDS)",
                                 settings_.stall_shutdown_s)
                   : std::string());
    }
  }
  if (settings_.stall_shutdown_s > 0) {
    // Past the shutdown time the job ends, on every rank: one message for all the tensors that
    // stalled that long, grouped by the ranks that have and lack them, sent as a fatal response.
    auto stalled =
        table_->FindStalled(now, std::chrono::duration<double>(settings_.stall_shutdown_s));
    if (stalled.empty()) return;
    std::map<std::pair<std::vector<int>, std::vector<int>>,
             std::vector<const MessageTable::Stalled*>>
        groups;
    double longest = 0;
    for (const auto& s : stalled) {
      groups[{s.ready_ranks, s.missing_ranks}].push_back(&s);
      longest = std::max(longest, s.waited_s);
    }
    std::vector<std::string> parts;
    for (const auto& [ranks, members] : groups) {
      constexpr size_t kNamed = 3;
      std::vector<std::string> names;
      for (size_t i = 0; i < members.size() && i < kNamed; ++i) {
        names.push_back(fmt::format("'{}'", members[i]->name));
      }
      parts.push_back(fmt::format(
          "{}{} submitted by ranks {}, never by ranks {}", fmt::join(names, ", "),
          members.size() > kNamed ? fmt::format(" and {} more", members.size() - kNamed) : "",
          FormatRanks(ranks.first), FormatRanks(ranks.second)));
    }
    const std::string message = fmt::format(
        "tensors stalled for up to {:.1f} s (KOLO_STALL_SHUTDOWN_SECONDS={:g}), so the job "
        "ends: {}",
        longest, settings_.stall_shutdown_s, fmt::join(parts, "; "));
    for (const auto& s : stalled) {
      stall_warned_.erase(s.name);
      Response r = table_->Fail(s.name, message);
      r.kind = Response::Kind::kFatal;
      errors->push_back(std::move(r));
    }
  }
}

}  // namespace kolo::coordinator
