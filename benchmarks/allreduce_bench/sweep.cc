#include "benchmarks/allreduce_bench/sweep.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

namespace kolo::bench {
namespace {

using Clock = std::chrono::steady_clock;

// This process's CPU time (user and system, every thread), microseconds.
double ProcessCpuUs() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return (static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e6) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Measures every row at one size, iteration by iteration in turn (round i runs row 0, row 1, ...),
// so that drifting machine load falls on every row alike and their ratios compare like with like.
// With --device cuda, `device` holds the working buffer the rows reduce; `buf` receives each row's
// last result for the check.
StatusOr<std::vector<SweepRow>> MeasureSize(const BenchConfig& config,
                                            std::vector<std::unique_ptr<Backend>>& rows,
                                            HostBuffer& in, HostBuffer& buf, DeviceBuffer* device,
                                            int64_t bytes, Control& control) {
  const size_t count = static_cast<size_t>(bytes) / DataTypeSize(config.dtype);
  const BenchBuffer work =
      device != nullptr ? device->view() : BenchBuffer{buf.data(), buf.size(), -1};
  auto where = [&](const Backend& b) { return fmt::format("{} at {} bytes", b.name(), bytes); };
  size_t bound = 0;  // rows [0, bound) hold per-size state
  Status s;
  while (s.ok() && bound < rows.size()) {
    s = rows[bound]->Bind(work, count);
    if (s.ok()) {
      ++bound;
    } else {
      s = s.WithContext(where(*rows[bound]));
    }
  }

  const int rounds = config.warmup + config.iters;
  std::vector<std::vector<double>> times(rows.size(),
                                         std::vector<double>(static_cast<size_t>(config.iters)));
  std::vector<std::vector<double>> cpu(rows.size(),
                                       std::vector<double>(static_cast<size_t>(config.iters)));
  std::vector<CheckResult> checks(rows.size());
  for (int i = 0; s.ok() && i < rounds; ++i) {
    for (size_t r = 0; s.ok() && r < rows.size(); ++r) {
      // Untimed: every iteration starts from this rank's input (rows reduce in place). A row that
      // reduced nothing would leave the input, which differs from the sum at more than one rank.
      // The barrier keeps one rank's clock from running while another is still restoring.
      if (device != nullptr) {
        s = device->CopyFromHost(in.data());
      } else {
        std::memcpy(buf.data(), in.data(), static_cast<size_t>(bytes));
      }
      if (s.ok()) s = control.Barrier();
      if (!s.ok()) break;
      const double c0 = ProcessCpuUs();
      const auto t0 = Clock::now();
      s = rows[r]->RunOnce();
      const auto t1 = Clock::now();
      const double c1 = ProcessCpuUs();
      // And no rank restores for the next round while another's clock still runs.
      if (s.ok()) s = control.Barrier();
      if (!s.ok()) {
        s = s.WithContext(where(*rows[r]));
        break;
      }
      if (i >= config.warmup) {
        times[r][static_cast<size_t>(i - config.warmup)] =
            std::chrono::duration<double, std::micro>(t1 - t0).count();
        cpu[r][static_cast<size_t>(i - config.warmup)] = c1 - c0;
      }
      // The last round's result of each row is checked before the next row overwrites it.
      if (i == rounds - 1 && config.check && rows[r]->reduces()) {
        if (device != nullptr) s = device->CopyToHost(buf.data());
        if (!s.ok()) break;
        checks[r] = CheckOutput(config.dtype, buf.data(), count, control.size(), config.op);
      }
    }
  }
  for (size_t r = 0; r < bound; ++r) rows[r]->Unbind();
  if (!s.ok()) return s;

  std::vector<SweepRow> out;
  for (size_t r = 0; r < rows.size(); ++r) {
    const Backend& backend = *rows[r];
    SweepRow row;
    row.bytes = bytes;
    row.count = static_cast<int64_t>(count);
    row.dtype = config.dtype;
    row.backend = backend.name();
    row.kind = backend.kind();
    row.transport = backend.transport();
    row.pairs = backend.pairs();
    row.checked = config.check && backend.reduces();
    row.engine_parts_us = backend.EngineParts();
    // One gather per row: this rank's times, then its check result.
    std::vector<double> mine = times[r];
    mine.push_back(static_cast<double>(checks[r].wrong));
    mine.push_back(checks[r].max_error);
    mine.insert(mine.end(), cpu[r].begin(), cpu[r].end());
    KOLO_ASSIGN_OR_RETURN(std::vector<double> all, control.AllgatherDoubles(mine));
    const size_t stride = mine.size();
    std::vector<double> per_rank_times;
    for (int k = 0; k < control.size(); ++k) {
      const double* base = all.data() + k * stride;
      per_rank_times.insert(per_rank_times.end(), base, base + config.iters);
      row.wrong += static_cast<int64_t>(base[config.iters]);
      row.max_error = std::max(row.max_error, base[config.iters + 1]);
      row.cpu_iters_us.resize(static_cast<size_t>(config.iters));
      for (int i = 0; i < config.iters; ++i) row.cpu_iters_us[i] += base[config.iters + 2 + i];
    }
    row.time = Summarize(per_rank_times, control.size(), config.iters);
    row.algbw_gbs = AlgBandwidth(bytes, row.time.median_us * 1e-6);
    row.busbw_gbs = BusBandwidth(row.algbw_gbs, control.size());
    out.push_back(std::move(row));
  }
  return out;
}

// Among rows of one kind at one size (gloo's two algorithms), marks the fastest. Ring and link
// rows over several transports are not alternatives of one kind: each is its transport's.
void MarkBest(std::vector<SweepRow>& rows) {
  std::map<BackendKind, int> count;
  for (const SweepRow& r : rows) ++count[r.kind];
  for (auto& [kind, n] : count) {
    if (n < 2 || kind == BackendKind::kRing || kind == BackendKind::kLink) continue;
    SweepRow* best = nullptr;
    for (SweepRow& r : rows) {
      if (r.kind == kind && (best == nullptr || r.time.median_us < best->time.median_us)) best = &r;
    }
    best->best_of_kind = true;
  }
}

}  // namespace

TimeSummary Summarize(const std::vector<double>& per_rank_times, int ranks, int iters) {
  std::vector<double> worst(static_cast<size_t>(iters), 0.0);
  for (int r = 0; r < ranks; ++r) {
    for (int i = 0; i < iters; ++i) {
      worst[i] = std::max(worst[i], per_rank_times[static_cast<size_t>(r * iters + i)]);
    }
  }
  TimeSummary t;
  if (worst.empty()) return t;
  t.iters_us = worst;
  t.median_us = Median(worst);
  t.min_us = *std::min_element(worst.begin(), worst.end());
  t.max_us = *std::max_element(worst.begin(), worst.end());
  return t;
}

double AlgBandwidth(int64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

double BusBandwidth(double algbw, int ranks) { return algbw * 2.0 * (ranks - 1) / ranks; }

StatusOr<std::vector<SweepRow>> RunSweep(
    const BenchConfig& config, std::vector<std::unique_ptr<Backend>>& rows, Control& control,
    int local_rank, const std::function<void(const std::vector<SweepRow>&)>& on_size) {
  std::vector<SweepRow> all;
  for (int64_t bytes : SweepSizes(config)) {
    // Both buffers are allocated once per size and pre-faulted; every row reuses them.
    KOLO_ASSIGN_OR_RETURN(HostBuffer in, HostBuffer::Allocate(static_cast<size_t>(bytes)));
    KOLO_ASSIGN_OR_RETURN(HostBuffer buf, HostBuffer::Allocate(static_cast<size_t>(bytes)));
    std::unique_ptr<DeviceBuffer> device;
    if (config.place == BufferPlace::kCuda) {
      KOLO_ASSIGN_OR_RETURN(device, AllocateDeviceBuffer(static_cast<size_t>(bytes), local_rank));
    }
    FillInput(config.dtype, in.data(), static_cast<size_t>(bytes) / DataTypeSize(config.dtype),
              control.rank());
    KOLO_ASSIGN_OR_RETURN(std::vector<SweepRow> size_rows,
                          MeasureSize(config, rows, in, buf, device.get(), bytes, control));
    MarkBest(size_rows);
    on_size(size_rows);
    all.insert(all.end(), size_rows.begin(), size_rows.end());
  }
  return all;
}

}  // namespace kolo::bench
