// Command-line flags for the engine's Options, shared by every kolo tool (bench, trainer).
//
// Each flag overrides the value OptionsFromEnvironment() read from KOLO_*; units are in the
// names. Usage:
//   CLI::App app;  EngineFlags flags;  flags.Add(app);  CLI11_PARSE(app, argc, argv);
//   KOLO_ASSIGN_OR_RETURN(Options o, OptionsFromEnvironment());
//   KOLO_RETURN_IF_ERROR(flags.Apply(&o));   // validates; errors name the flag and value
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "engine/common/options.h"

namespace kolo {

class EngineFlags {
 public:
  // Registers --backend, --transport, --fusion-threshold-mb, --cycle-time-ms, --cache-capacity,
  // --timeline,
  // --stall-check-s, --stall-shutdown-s, --peer-timeout-s, --iface, --log-level,
  // --ring-chunk-kb, --socket-buffer-kb, --host-name, --hierarchical-allreduce in group "Engine",
  // and --ps-servers, --ps-server-ranks,
  // --ps-placement in group "Parameter server".
  void Add(CLI::App& app);
  // Writes the flags that were given into *options and validates the result.
  Status Apply(Options* options) const;

 private:
  std::optional<std::string> backend_, transport_, timeline_, iface_, log_level_;
  std::optional<std::string> allreduce_algorithm_;
  std::optional<std::string> compression_;
  std::optional<std::string> tcp_streams_;
  std::optional<double> fusion_threshold_mb_, cycle_time_ms_, stall_check_s_, stall_shutdown_s_,
      peer_timeout_s_, start_timeout_s_;
  std::optional<int> cache_capacity_;
  std::optional<int64_t> ring_chunk_kb_, socket_buffer_kb_, shm_ring_kb_;
  std::optional<int> ps_servers_;
  std::optional<std::string> host_name_;
  std::optional<std::string> ib_device_;
  std::optional<int> ib_port_, ib_gid_index_;
  bool hierarchical_ = false;
  std::optional<std::string> ps_server_ranks_, ps_placement_, ps_pacing_;
};

}  // namespace kolo
