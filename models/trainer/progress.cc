#include "models/trainer/progress.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>

namespace kolo::models::trainer {
namespace {

std::string Clock(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

const char* kRule = "----------------------------------------------------------------";

}  // namespace

Progress::Progress(std::FILE* out, int warmup_steps, int timed_steps, int display_every,
                   bool replay, double dilation, const std::atomic<bool>* stop)
    : out_(out),
      warmup_(warmup_steps),
      timed_(timed_steps),
      every_(display_every),
      replay_(replay),
      dilation_(dilation),
      stop_(stop) {
  if (out_ == nullptr) return;
  std::fprintf(out_, "%s\t%s\t%s\n", "Step", "Img/sec", "total_loss");
  if (warmup_ > 0) std::fprintf(out_, "Running warm-up: %d steps\n", warmup_);
  std::fflush(out_);
}

namespace {

// A timer signal of the calling thread's own, whose handler does nothing: it only makes a blocked
// write() return (the handler is installed without SA_RESTART), so that the writer can look at
// the stop flag.
const int kTickSignal = SIGRTMIN + 3;
void OnTick(int) {}

// Writes `text` to `fd`; while a write blocks (a terminal or pipe nobody drains, as mpirun's after
// Ctrl-C), every 100 ms it looks at `stop` and, once that is set, drops the rest. True when all of
// it was written.
bool WriteStoppable(int fd, const std::string& text, const std::atomic<bool>& stop) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = OnTick;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: a blocked write returns
    sigaction(kTickSignal, &sa, nullptr);
  });
  timer_t timer{};
  sigevent ev{};
  ev.sigev_notify = SIGEV_THREAD_ID;
  ev.sigev_signo = kTickSignal;
  ev._sigev_un._tid = static_cast<pid_t>(::syscall(SYS_gettid));
  const bool timed = ::timer_create(CLOCK_MONOTONIC, &ev, &timer) == 0;
  if (timed) {
    itimerspec every{};
    every.it_interval.tv_nsec = every.it_value.tv_nsec = 100 * 1000 * 1000;
    ::timer_settime(timer, 0, &every, nullptr);
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      if (stop.load()) break;
    } else {
      break;
    }
  }
  if (timed) ::timer_delete(timer);
  return done == text.size();
}

}  // namespace

void Progress::Add(int step, double images_per_sec, double wall_seconds, double loss) {
  if (out_ == nullptr) return;
  elapsed_ += wall_seconds;
  window_.push_back(images_per_sec);
  const bool warm = step < warmup_;
  const int n = warm ? step + 1 : step + 1 - warmup_;  // 1-based within the phase
  const int phase_steps = warm ? warmup_ : timed_;
  if (n % every_ != 0 && n != phase_steps) return;
  double mean = 0;
  for (double r : window_) mean += r;
  mean /= static_cast<double>(window_.size());
  double var = 0;
  for (double r : window_) var += (r - mean) * (r - mean);
  const double stddev = std::sqrt(var / static_cast<double>(window_.size()));
  std::vector<double> dev;
  std::vector<double> sorted = window_;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  for (double r : window_) dev.push_back(std::fabs(r - median));
  std::sort(dev.begin(), dev.end());
  const double jitter = dev[dev.size() / 2];
  // The ETA assumes the remaining steps take as long as the steps so far.
  const int done = step + 1;
  const int left = warmup_ + timed_ - done;
  const double eta = elapsed_ / done * left;
  const std::string loss_text = replay_ ? "n/a" : fmt::format("{:.4f}", loss);
  std::string line = fmt::format(
      "{}{}\timages/sec: {:.1f} +/- {:.1f} (jitter = {:.1f})\t{}\t"
      "elapsed {} eta {}",
      warm ? "w" : "", n, mean, stddev, jitter, loss_text, Clock(elapsed_), Clock(eta));
  if (replay_) line += "\tcompute=replay";
  if (dilation_ != 1) line += fmt::format(" dilation={}", dilation_);
  window_.clear();
  line += "\n";
  if (warm && n == warmup_) line += "Warm-up done\n";
  if (stop_ == nullptr) {
    std::fputs(line.c_str(), out_);
    std::fflush(out_);
    return;
  }
  // Straight to the descriptor (the stream holds nothing: every write before was flushed), so
  // that a write blocked by a reader that went away gives way once the run is to stop.
  std::fflush(out_);
  WriteStoppable(::fileno(out_), line, *stop_);
}

void PrintHeader(std::FILE* out, const RunSettings& s, const Graph& graph, int ranks, int nodes,
                 const compute::SgdConfig& sgd) {
  const int64_t global = s.batch_size * s.backward_passes_per_step * ranks;
  std::string text;
  text += fmt::format("Model:       {} ({} parameters in {} tensors, {:.2f} GMACs/image)\n",
                      s.model, graph.NumParameterElements(), graph.params().size(),
                      static_cast<double>(graph.ForwardMacsPerImage()) * 1e-9);
  text += fmt::format("Input:       {}x{} images, {} classes, synthetic data\n", s.image_size,
                      s.image_size, s.num_classes);
  text += fmt::format("Batch size:  {} per rank x {} backward passes per step x {} ranks = {}\n",
                      s.batch_size, s.backward_passes_per_step, ranks, global);
  text += fmt::format("Ranks:       {} on {} host{}\n", ranks, nodes, nodes == 1 ? "" : "s");
  text += fmt::format("Compute:     compute={} precision={}{}\n", s.compute, s.precision,
                      s.compute == "replay" ? " profile=" + s.profile : "");
  if (s.compute == "replay") {
    text += "Loss:        not computed (replay sleeps recorded layer times; gradients are zeros)\n";
  }
  if (s.dilation != 1) {
    text += fmt::format(
        "Dilation:    {}: each recorded time is slept {} times over; every time and rate below is "
        "the measured one / {} (the represented pace; elapsed and eta are wall time)\n",
        s.dilation, s.dilation, s.dilation);
  }
  text += fmt::format("Engine:      backend={} transport={} fusion={} MiB cycle={} ms\n", s.backend,
                      s.transport, s.fusion_threshold_mb, s.cycle_time_ms);
  text += fmt::format("SGD:         learning rate {}, momentum {}, weight decay {}\n",
                      sgd.learning_rate, sgd.momentum, sgd.weight_decay);
  text += fmt::format("Steps:       {} warm-up, {} timed\n", s.num_warmup_batches, s.num_batches);
  std::fprintf(out, "%s", text.c_str());
  std::fflush(out);
}

void PrintTotal(std::FILE* out, const RunResults& r, bool replay, double dilation) {
  std::string tag_text = replay ? " (compute=replay" : "";
  if (replay && dilation != 1) tag_text += fmt::format(", dilation={}", dilation);
  if (replay) tag_text += ")";
  const char* tag = tag_text.c_str();
  std::fprintf(out, "%s\n", kRule);
  std::fprintf(out, "total images/sec: %.2f%s\n", r.total_images_per_sec, tag);
  std::fprintf(out, "%s\n", kRule);
  std::fprintf(out,
               "per rank: %.2f images/sec, median step %.1f ms (%.1f ms waiting on collectives), "
               "kernel share %.1f%%%s\n",
               r.images_per_sec_per_rank, r.step_time_ms_median, r.exposed_wait_ms_median,
               100.0 * r.kernel_share, tag);
  std::fflush(out);
}

}  // namespace kolo::models::trainer
