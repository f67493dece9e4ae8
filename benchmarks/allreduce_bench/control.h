// The benchmark's control channel: barriers and small gathers between ranks that are not part of
// any measurement (aligning the start of a row, collecting per-iteration times, host names, check
// results). Under mpirun it is MPI (MakeMpiControl in mpi/mpi_peer.h); otherwise collectives over a
// Device (device_control.h); a single rank needs none (LocalControl).
//
// Every method is collective: all ranks call it, in the same order, from the main thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/common/status.h"

namespace kolo::bench {

class Control {
 public:
  virtual ~Control() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi", "tcp", "local": what carries the control messages.
  virtual const char* name() const = 0;

  virtual Status Barrier() = 0;
  // Every rank contributes `mine` (the same length on every rank); returns the concatenation in
  // rank order (size() * mine.size() values) on every rank.
  virtual StatusOr<std::vector<double>> AllgatherDoubles(const std::vector<double>& mine) = 0;
  // Every rank's string, in rank order, on every rank.
  virtual StatusOr<std::vector<std::string>> AllgatherStrings(const std::string& mine) = 0;
};

// The control channel of a single-rank run.
class LocalControl final : public Control {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* name() const override { return "local"; }
  Status Barrier() override { return Status::OK(); }
  StatusOr<std::vector<double>> AllgatherDoubles(const std::vector<double>& mine) override {
    return mine;
  }
  StatusOr<std::vector<std::string>> AllgatherStrings(const std::string& mine) override {
    return std::vector<std::string>{mine};
  }
};

}  // namespace kolo::bench
