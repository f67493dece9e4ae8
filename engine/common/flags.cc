#include "engine/common/flags.h"

#include <cmath>

namespace kolo {

void EngineFlags::Add(CLI::App& app) {
  const std::string g = "Engine";
  app.add_option(
         "--backend", backend_,
         "collective backend: ring | mpi | ps | nccl (KOLO_BACKEND); kolo-train also takes none: "
         "one rank, no distributed communication (the single-rank baseline)")
      ->group(g);
  app.add_option("--transport", transport_,
                 "how bytes move between ranks: auto (shared memory within a host, TCP between "
                 "hosts) | shm | tcp (KOLO_TRANSPORT, default auto)")
      ->group(g);
  app.add_option("--fusion-threshold-mb", fusion_threshold_mb_,
                 "Tensor Fusion buffer size in MiB; 0 disables fusion (default 64)")
      ->group(g);
  app.add_option("--cycle-time-ms", cycle_time_ms_, "background cycle in milliseconds (default 1)")
      ->group(g);
  app.add_option("--cache-capacity", cache_capacity_,
                 "response-cache entries; 0 disables the cache (default 1024)")
      ->group(g);
  app.add_option("--timeline", timeline_, "write a Chrome-trace timeline to this path")->group(g);
  app.add_option("--stall-check-s", stall_check_s_,
                 "warn about stalled tensors after this many seconds; 0 = off (default 60)")
      ->group(g);
  app.add_option("--stall-shutdown-s", stall_shutdown_s_,
                 "fail stalled tensors after this many seconds, naming the missing ranks; 0 = "
                 "never (default 300)")
      ->group(g);
  app.add_option("--peer-timeout-s", peer_timeout_s_,
                 "longest wait on a peer before failing (default 30)")
      ->group(g);
  app.add_option("--start-timeout-s", start_timeout_s_,
                 "under mpirun, longest MPI start-up before the job is ended (default 120)")
      ->group(g);
  app.add_option("--iface", iface_, "interface or IPv4 address to listen on")->group(g);
  app.add_option("--host-name", host_name_,
                 "the name ranks are grouped by host with (KOLO_HOST_NAME; default: the system's "
                 "host name)")
      ->group(g);
  app.add_flag("--hierarchical-allreduce", hierarchical_,
               "allreduce within each host, then across hosts, then within each host again "
               "(KOLO_HIERARCHICAL_ALLREDUCE=1)")
      ->group(g);
  app.add_option("--allreduce-algorithm", allreduce_algorithm_,
                 "auto | ring | recursive-doubling | halving-doubling | one-shot "
                 "(KOLO_ALLREDUCE_ALGORITHM; default auto: picked per collective by size)")
      ->group(g);
  app.add_option("--compression", compression_,
                 "none | fp16 | bf16: float32 gradients travel in half precision in allreduces "
                 "and parameter-server pushes (KOLO_COMPRESSION; default none)")
      ->group(g);
  app.add_option("--tcp-streams", tcp_streams_,
                 "TCP connections per pair of ranks, striping large messages across them: auto "
                 "(one per 10 Gbit/s of the NIC, at most 8; 1 on loopback) or 1-16 "
                 "(KOLO_TCP_STREAMS)")
      ->group(g);
  app.add_option("--log-level", log_level_, "trace | debug | info | warning | error")->group(g);
  app.add_option("--ring-chunk-kb", ring_chunk_kb_, "ring pipeline chunk in KiB")->group(g);
  app.add_option("--socket-buffer-kb", socket_buffer_kb_, "socket buffer size in KiB")->group(g);
  app.add_option("--shm-ring-kb", shm_ring_kb_,
                 "shared-memory ring size in KiB, a power of two (KOLO_SHM_RING_BYTES)")
      ->group(g);
  app.add_option("--ib-device", ib_device_,
                 "with --transport rdma: the RDMA device (KOLO_IB_DEVICE; default: the first with "
                 "an ACTIVE port)")
      ->group(g);
  app.add_option("--ib-port", ib_port_, "with --transport rdma: the port (KOLO_IB_PORT, default 1)")
      ->group(g);
  app.add_option("--ib-gid-index", ib_gid_index_,
                 "with --transport rdma: the GID index (KOLO_IB_GID_INDEX; default: automatic)")
      ->group(g);
  const std::string ps = "Parameter server";
  app.add_option("--ps-servers", ps_servers_,
                 "with --backend ps: how many ranks serve; by default the last ones "
                 "(KOLO_PS_SERVERS, default 1)")
      ->group(ps);
  app.add_option("--ps-server-ranks", ps_server_ranks_,
                 "with --backend ps: the ranks that serve, comma-separated, e.g. 8,17 "
                 "(KOLO_PS_SERVER_RANKS)")
      ->group(ps);
  app.add_option("--ps-placement", ps_placement_,
                 "with --backend ps: greedy (whole tensors, fewest bytes first; default) | split "
                 "(large tensors cut across servers) (KOLO_PS_PLACEMENT)")
      ->group(ps);
  app.add_option("--ps-pacing", ps_pacing_,
                 "with --backend ps: the most each worker sends per second to each server, e.g. "
                 "125mbit (SO_MAX_PACING_RATE; off by default) (KOLO_PS_PACING)")
      ->group(ps);
}

Status EngineFlags::Apply(Options* o) const {
  if (backend_) o->backend = *backend_;
  if (transport_) o->transport = *transport_;
  if (timeline_) o->timeline_path = *timeline_;
  if (iface_) o->iface = *iface_;
  if (host_name_) {
    if (host_name_->empty()) return InvalidArgument("--host-name is empty; give a host name");
    o->host_name = *host_name_;
  }
  if (hierarchical_) o->hierarchical_allreduce = true;
  if (allreduce_algorithm_) o->allreduce_algorithm = *allreduce_algorithm_;
  if (compression_) o->compression = *compression_;
  if (tcp_streams_) {
    KOLO_ASSIGN_OR_RETURN(o->tcp_streams, ParseTcpStreams("--tcp-streams", *tcp_streams_));
  }
  if (log_level_) {
    auto level = ParseLogLevel(*log_level_);
    if (!level.ok())
      return InvalidArgument(
          "--log-level '{}': allowed are trace, debug, info, "
          "warning, error",
          *log_level_);
    o->log_level = *level;
  }
  if (fusion_threshold_mb_) {
    if (!(*fusion_threshold_mb_ >= 0) || *fusion_threshold_mb_ > 1024 * 1024) {
      return InvalidArgument("--fusion-threshold-mb {} is outside [0, 1048576]",
                             *fusion_threshold_mb_);
    }
    o->fusion_threshold_bytes = std::llround(*fusion_threshold_mb_ * 1024 * 1024);
  }
  if (cycle_time_ms_) o->cycle_time_ms = *cycle_time_ms_;
  if (cache_capacity_) o->cache_capacity = *cache_capacity_;
  if (stall_check_s_) o->stall_warning_s = *stall_check_s_;
  if (stall_shutdown_s_) o->stall_shutdown_s = *stall_shutdown_s_;
  if (peer_timeout_s_) o->peer_timeout_s = *peer_timeout_s_;
  if (start_timeout_s_) o->start_timeout_s = *start_timeout_s_;
  if (ring_chunk_kb_) o->ring_chunk_bytes = *ring_chunk_kb_ * 1024;
  if (socket_buffer_kb_) o->socket_buffer_bytes = *socket_buffer_kb_ * 1024;
  if (shm_ring_kb_) o->shm_ring_bytes = *shm_ring_kb_ * 1024;
  if (ib_device_) {
    if (ib_device_->empty()) return InvalidArgument("--ib-device is empty; name an RDMA device");
    o->ib_device = *ib_device_;
  }
  if (ib_port_) o->ib_port = *ib_port_;
  if (ib_gid_index_) o->ib_gid_index = *ib_gid_index_;
  if (ps_server_ranks_) {
    auto ranks = ParseRankList("--ps-server-ranks", *ps_server_ranks_);
    if (!ranks.ok()) return ranks.status();
    o->ps_server_ranks = *ranks;
    o->ps_servers = static_cast<int>(ranks->size());
  }
  if (ps_servers_) o->ps_servers = *ps_servers_;
  if (ps_placement_) o->ps_placement = *ps_placement_;
  if (ps_pacing_) {
    auto rate = ParseBitRate("--ps-pacing", *ps_pacing_);
    if (!rate.ok()) return rate.status();
    o->ps_pacing_bits_per_s = *rate;
  }
  Status s = o->Validate();
  if (!s.ok()) return s.WithContext("invalid engine flags");
  return Status::OK();
}

}  // namespace kolo
