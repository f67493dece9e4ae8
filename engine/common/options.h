// Options: every engine knob in one struct, with its default and unit.
//
// Filled once from the environment (KOLO_*, and the launchers' variables: launch_env.h) by
// OptionsFromEnvironment(), then optionally overridden by command-line flags (AddEngineFlags in
// engine/common/flags.h). Nothing else in kolo reads the environment.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/common/dtype.h"
#include "engine/common/logging.h"
#include "engine/common/status.h"

namespace kolo {

// A setting every rank of a job must share, by name, as the start-up check compares it.
struct MatchedSetting {
  std::string name;
  std::string value;
  bool operator==(const MatchedSetting&) const = default;
};

struct Options {
  // --- Launch: which rank this process is. From OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}
  // under mpirun, else KOLO_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE} (set by kolo-run), else srun's or
  // Hydra's variables; a process with none is a single rank (rank 0 of 1).
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  // Also from Slurm's srun and from MPICH's or Intel MPI's Hydra (launch_env.h). `launcher` says
  // which: "mpirun", "kolo-run", "srun", "hydra", or "" for a single rank with no launcher.
  std::string launcher;
  // True when the values came from Open MPI's environment (the bootstrap then exchanges addresses
  // over MPI and the mpi backend is available).
  bool launched_by_mpirun = false;
  // srun and Hydra: "host:port" where rank 0 serves the rendezvous store and every rank finds it
  // (KOLO_STORE_ADDR, or under srun the step's first node; launch_env.h). Needs KOLO_JOB_SECRET.
  std::string serve_store_addr;

  // --- Rendezvous (launch without MPI). KOLO_STORE_ADDR "host:port" of the key-value store that
  // rank 0 serves; KOLO_JOB_SECRET the per-job secret every connection must present (hex, at
  // least 16 characters). Under mpirun both are made by rank 0 and shared over MPI.
  std::string store_addr;
  std::string job_secret;

  // --- Network. KOLO_IFACE: the interface or IPv4 address to listen on. Empty: 127.0.0.1 when
  // every rank is on this host (local_size == size), else the address of the host name.
  std::string iface;
  // KOLO_HOST_NAME: the name this rank's host goes by when ranks are grouped by host (the
  // shared-memory transport within a host, hierarchical allreduce, error messages). Empty: the
  // system's host name (gethostname). Ranks with the same name are on the same host.
  std::string host_name;
  // KOLO_SOCKET_BUFFER_BYTES: SO_SNDBUF and SO_RCVBUF of every data connection. Unset,
  // OptionsFromEnvironment sizes it by AutoSocketBufferBytes: the bytes every local rank keeps in
  // flight should stay within the shared last-level cache, so the more ranks on the host (and per
  // processor), the smaller each one's buffers (with a 32 MiB L3 and 2 processors: 2 MiB at 2
  // local ranks, 512 KiB at 4).
  int64_t socket_buffer_bytes = 2 << 20;
  // KOLO_SHM_RING_BYTES: bytes of each shared-memory ring of the shm transport (one per direction
  // and pair of ranks on a host; the pairs' segments hold two each): a power of two from 64 KiB
  // to 1 GiB. 1 MiB: at 4 ranks on 2 cores, 64 MiB float32 allreduces took the least time and CPU
  // with it (512 KiB to 4 MiB measured; a larger ring lets more bytes in flight fall out of the
  // cache).
  int64_t shm_ring_bytes = 1 << 20;
  // KOLO_TCP_STREAMS: TCP connections per pair of ranks, 1 to 16, or 0 ("auto"): one per
  // 10 Gbit/s of the listening interface's link speed (/sys/class/net/IFACE/speed), at most 8;
  // 1 on loopback, on virtual links and where the speed is unknown (AutoTcpStreams). On a fast NIC
  // one TCP flow is bounded by one congestion window and by the copies of one core; a message of
  // at least KOLO_TCP_STRIPE_MIN_BYTES is striped across the pair's streams (the TCP transport's
  // "Several streams"). Within a pair the connecting (higher) rank's count holds.
  int tcp_streams = 0;
  // KOLO_TCP_STRIPE_MIN_BYTES: the smallest message striped across several streams; smaller ones
  // go whole on the first (a few parts each would cost more in system calls than they gain).
  int64_t tcp_stripe_min_bytes = 256 << 10;
  // KOLO_EMULATED_FLOW_CAP: the emulated cluster's per-flow cap (scripts/cluster up --flow-cap),
  // as a rate ("200mbit"; "off" or 0: none): every data connection of the TCP transport is paced
  // at it (SO_MAX_PACING_RATE), standing in for a NIC on which one TCP flow reaches only part of
  // the link. An emulation for kolo's own studies, never a setting for a real cluster.
  double emulated_flow_cap_bits_per_s = 0;
  // KOLO_RING_CHUNK_BYTES: pipeline chunk of the ring collectives; a segment larger than this is
  // sent in pieces so that sending, receiving and reducing overlap.
  int64_t ring_chunk_bytes = 512 << 10;
  // KOLO_PEER_TIMEOUT_SECONDS: longest any blocking wait on a peer may take before it fails with
  // an error naming the peer (connection set-up, a collective, a control message).
  double peer_timeout_s = 30.0;
  // KOLO_START_TIMEOUT_SECONDS: longest MPI's start-up (MPI_Init and the rendezvous broadcast that
  // follows) may take under mpirun before the job is ended; at least the peer timeout. MPI_Init
  // of a large job, or on a slow host, can take far longer than a peer may stay silent.
  double start_timeout_s = 120.0;
  // KOLO_BUSY_POLL: spin on the sockets and shared-memory rings instead of sleeping in epoll (only
  // for dedicated cores).
  bool busy_poll = false;
  // KOLO_POLL_SPIN_US: before a wait sleeps, it looks for progress for up to this long, yielding
  // the processor between looks (sched_yield), so that a reply that comes quickly costs no sleep
  // and wake-up while a thread of another rank that needs the processor still gets it; 0 sleeps
  // at once. Measured on loopback (kolo-allreduce-bench --algorithms, docs/measured.md): a 4 KB
  // allreduce of 4 ranks on 2 cores over shm went from 3x to 1x Open MPI's time at 20 us.
  int64_t poll_spin_us = 20;
  // KOLO_RIDING_MAX_BYTES: where every rank's news is the same response-cache hits and they are
  // host allreduces of at most this many bytes together (sum or average, one dtype, no
  // compression, the ring backend at allreduce algorithm auto), their data rides the negotiation's
  // bit exchange and is summed on arrival: one exchange instead of an exchange and a collective.
  // No more than 192 KiB over the messages a rank receives in the exchange (ranks - 1 up to 16
  // ranks, ceil(log2 ranks) beyond), and not where every rank shares one host over shared memory
  // (transport auto or shm), where it measured slower. 0 turns it off. Every rank must agree.
  int64_t riding_max_bytes = 32 << 10;
  // The RDMA transport (--transport rdma). KOLO_IB_DEVICE / --ib-device: the device by name (as
  // ibv_devices lists it); empty: the first device whose port ib_port is ACTIVE. KOLO_IB_PORT /
  // --ib-port: the port number. KOLO_IB_GID_INDEX / --ib-gid-index: the GID table entry to route
  // by; -1 (automatic): on RoCE a RoCE v2 IPv4-mapped GID if the port has one, else entry 0; on
  // InfiniBand LID routing. KOLO_IB_VERBS: which verbs the transport calls, "libibverbs"
  // (rdma-core, loaded at run time) or "soft" (the in-process software verbs device, for tests: it
  // proves the protocol logic, not RDMA performance, and reaches only ranks of the same process).
  std::string ib_device;
  int ib_port = 1;
  int ib_gid_index = -1;
  std::string ib_verbs = "libibverbs";
  // KOLO_ENGINE_SCHED: scheduling policy of the background thread. "batch" (SCHED_BATCH: when a
  // message wakes it, it waits for the running thread to block or use up its slice instead of
  // preempting it), "normal" (the default policy), or "auto": batch when the local ranks
  // outnumber the host's processors, normal otherwise. See EngineThreadIsBatch.
  std::string engine_sched = "auto";
  // KOLO_CALLER_PROGRESS: a caller waiting on a handle drives the engine itself (negotiation and
  // collectives run on its thread) whenever the background thread is not driving, instead of
  // handing the work to that thread and sleeping until it completes: two thread wake-ups fewer
  // per small collective. Only the ring backend with host tensors; the background thread keeps
  // driving everything else. See Engine::Wait.
  bool caller_progress = true;

  // --- Engine.
  // KOLO_BACKEND: collective backend for fused buffers: "ring" (kolo's ring over the transport)
  // or "mpi" (MPI_Allreduce; needs mpirun). "ps": parameter servers update the variables
  // (Engine::PushPullAsync); collectives among the workers run on the ring.
  // "nccl": tensors in CUDA device memory go through NCCL (one GPU per rank: device local_rank
  // modulo the device count), host tensors through the ring. With "ring", device tensors go
  // through the ring via pinned host staging; other backends refuse device tensors. "none": one
  // rank and no engine at all (kolo-train's single-rank baseline); Engine::Create refuses it.
  std::string backend = "ring";
  // KOLO_MPI_IDLE_PROGRESS: with the mpi backend, keep MPI progressing while the engine is outside
  // MPI (a probe every 5 ms from the backend's watchdog thread; needs MPI_THREAD_MULTIPLE), so
  // that a peer left inside a collective by a protocol message still queued here is not stranded
  // while this rank negotiates over kolo's own transport (docs/reliability.md). 0 turns it off,
  // for diagnosis only.
  bool mpi_idle_progress = true;
  // KOLO_TRANSPORT: how the ring's bytes (and negotiation's, and the parameter server's) move
  // between ranks, by name in the transport registry (engine/transport/registry.h): "auto"
  // (shared memory between the ranks of one host, TCP between hosts), "shm" (every rank on one
  // host), "tcp" (TCP between every pair, loopback within a host).
  std::string transport = "auto";
  // KOLO_HIERARCHICAL_ALLREDUCE: ring allreduces in three steps instead of one flat ring:
  // reduce-scatter among the ranks of each host, an allreduce of each rank's slice across hosts
  // (one ring per local rank, all in parallel), allgather within each host. Needs the same number
  // of ranks on every host (engine creation fails naming the hosts otherwise). See
  // engine/docs/collectives.md.
  bool hierarchical_allreduce = false;
  // Connect the peers of hierarchical allreduce's rings at start-up even when it starts off, so
  // that Engine::Retune may switch it on (kolo-train --autotune sets it). Takes effect where the
  // job spans several hosts with the same number of ranks, more than one, on each
  // (Engine::CanSwitchHierarchical). Every rank must agree.
  bool hierarchical_switchable = false;
  // KOLO_ALLREDUCE_ALGORITHM: the algorithm of the ring backend's allreduces (host and staged
  // device tensors): "auto" (a rule picks per collective from its bytes, the rank count and the
  // hosts: collectives/plan.h), "ring", "recursive-doubling", "halving-doubling" or "one-shot"
  // (every rank on one host over shared memory: one step through a host-wide area). With
  // hierarchical allreduce only auto and ring are allowed (auto runs recursive doubling or
  // halving-doubling over every rank below its crossovers, the hierarchical rings above).
  std::string allreduce_algorithm = "auto";
  // KOLO_COMPRESSION: how float32 gradients travel in allreduces (Horovod's Compression.fp16):
  // "none", "fp16" (IEEE binary16) or "bf16" (bfloat16). A compressed collective casts its
  // tensors once into a half-precision buffer (the fusion buffer's pack and the cast are one
  // pass), reduces that (each receive summed in float32 and rounded to half once per hop), and
  // casts back into float32 outputs with an average's scaling in the same pass. Other dtypes,
  // broadcasts and allgathers are not compressed. With backend "ps" the workers' pushes travel
  // compressed and the servers sum them in float32; pulls (the weights) stay float32.
  std::string compression = "none";
  // KOLO_FUSION_THRESHOLD_BYTES: largest fusion buffer; 0 disables Tensor Fusion.
  int64_t fusion_threshold_bytes = 64ll << 20;
  // KOLO_CYCLE_TIME_MS: the background thread's cycle: a rank with new submissions starts the
  // exchange that agrees on them at most this long after its previous cycle began (so that
  // tensors submitted close together are agreed, and fused, together). A rank with nothing new
  // sleeps until a peer starts an exchange or work is submitted; idle ranks do not wake.
  double cycle_time_ms = 1.0;
  // KOLO_CACHE_CAPACITY: response-cache entries; 0 disables the cache.
  int cache_capacity = 1024;
  // KOLO_STALL_CHECK_SECONDS: rank 0 warns about a tensor some ranks submitted and others did
  // not after this long; 0 disables the check.
  double stall_warning_s = 60.0;
  // KOLO_STALL_SHUTDOWN_SECONDS: after this long a stalled tensor fails on every rank, naming the
  // ranks that never submitted it; 0 = never. A job whose ranks fell out of step (one stopped
  // early, one trains something else) then ends instead of waiting forever: every rank is alive,
  // so no peer timeout fires. Five minutes: far beyond the skew of ranks in step, even on
  // oversubscribed hosts.
  double stall_shutdown_s = 300.0;
  // KOLO_TIMELINE: path of the Chrome-trace timeline; empty = no timeline. Every rank writes its
  // own file: "%r" in the path is replaced by the rank; without it, ranks other than 0 insert
  // ".rank<N>" before the extension. Events carry pid = rank, so files merge by concatenation.
  std::string timeline_path;
  // Settings of the application (kolo-train: the model, batch size, steps...) that every rank
  // must share too; the start-up check compares them with the engine's (MustMatch).
  std::vector<MatchedSetting> app_settings;
  // KOLO_LOG_LEVEL: trace, debug, info, warning, error.
  LogLevel log_level = LogLevel::kWarning;

  // --- Parameter-server baseline (backend "ps"; engine/backends/ps/). The job's `size`
  // ranks split into K servers and size - K workers (data-parallel ranks).
  // How ranks map to roles: by default the servers are the LAST K ranks (size - K .. size - 1).
  // mpirun's default by-slot mapping fills hosts in order, so with `-np W+K -H h1:s1,...` the
  // servers land on the last host(s), colocated with that host's workers, and on one machine
  // every server shares the host with the workers. This needs no exchange between ranks, keeps
  // worker index == launch rank (so local_rank still selects the GPU), and works for any K.
  // To place one server on every host as tf_cnn_benchmarks' distributed runs did, give each
  // host one slot more than its GPUs and name the servers with KOLO_PS_SERVER_RANKS (with 4 hosts
  // of 8 GPUs: -np 36 -H h1:9,h2:9,h3:9,h4:9 and KOLO_PS_SERVER_RANKS=8,17,26,35).
  // KOLO_PS_SERVERS: K, in [1, size - 1]. When only KOLO_PS_SERVER_RANKS is given, K is its length.
  int ps_servers = 1;
  // KOLO_PS_SERVER_RANKS: the launch ranks that serve, comma-separated ("8,17"); empty = the last
  // K ranks. Distinct, each in [0, size), exactly K of them.
  std::vector<int> ps_server_ranks;
  // KOLO_PS_PLACEMENT: how variables are spread over the servers. "greedy" (default): whole
  // tensors, each to the server with the fewest bytes so far, in creation order (TensorFlow's
  // GreedyLoadBalancingStrategy, the baseline of the Horovod paper); "split": tensors of at least
  // 1 MiB cut evenly across all servers, smaller ones greedy.
  std::string ps_placement = "greedy";
  // KOLO_PS_PACING: the most each worker sends per second on each of its connections to a server,
  // as a rate in bits per second ("125mbit", "1.5gbit"; "off" or 0: unpaced, the default). The
  // kernel spaces the pushes' packets out (SO_MAX_PACING_RATE), so that the workers' streams into
  // a server's link share it evenly instead of as TCP's flows under incast do. Pacing at the
  // server link's fair share (its rate over the workers sending to it) keeps every worker's push
  // of a shard arriving together; scripts/cluster-incast measures what unpaced streams do.
  double ps_pacing_bits_per_s = 0;

  // Checks ranges and combinations; the error names the value and what is allowed.
  Status Validate() const;
};

// Options::tcp_streams as given ("auto" for 0) and its resolution for a rank listening on
// `listen_addr`: the value itself, or for auto one stream per 10 Gbit/s of that interface's link
// speed, at most 8 (1 for loopback, unknown speeds and addresses of no interface).
std::string TcpStreamsName(int tcp_streams);
// Reads a tcp_streams value as `what` ("KOLO_TCP_STREAMS", "--tcp-streams") gives it: "auto" or
// 1 to 16.
StatusOr<int> ParseTcpStreams(const std::string& what, const std::string& value);
int AutoTcpStreams(const std::string& listen_addr);

// The names Options::compression may take, in help-text order.
const std::vector<std::string>& CompressionNames();
// Options::compression's name as the dtype float32 tensors travel in: "none" -> kFloat32, "fp16"
// -> kFloat16, "bf16" -> kBFloat16; an error names the allowed values.
StatusOr<DataType> CompressionDataType(const std::string& name);

// The allreduce algorithms Options::allreduce_algorithm may name, in help-text order.
const std::vector<std::string>& AllreduceAlgorithmNames();

// The settings every rank of a job must share, the one list the start-up check compares
// (collectives/settings_check.h): those that decide what every rank computes on its own (fusion
// groups, cache bits, the algorithm and its message sizes, roles) and how ranks connect, then the
// application's (Options::app_settings). A new setting of that kind is added here. Per-rank values
// (paths, the rank, the host, timeouts) are not on it.
std::vector<MatchedSetting> MustMatch(const Options& o);

// Reads the options from `env` (name -> value). Invalid values are errors naming the variable,
// the value and what is allowed.
StatusOr<Options> OptionsFromEnvironment(const std::map<std::string, std::string>& env);
// The same, from this process's environment.
StatusOr<Options> OptionsFromEnvironment();

// The default socket buffer for `local_size` ranks sharing `cpus` processors on a host whose
// last-level cache holds `cache_bytes` (0 when unknown): cache_bytes / (8 * local_size *
// ranks_per_cpu), ranks_per_cpu = ceil(local_size / cpus), the power of two at or below it, within
// [512 KiB, 4 MiB]. Each connection keeps up to about twice its buffer in flight (send and receive
// queues); with a processor per rank, receivers drain them promptly and a quarter of the cache
// bounds what all local ranks hold. Ranks that share a processor are descheduled while their
// neighbours keep sending, so their buffers stay full and the share shrinks by the ranks per
// processor. Unknown cache: 2 MiB.
int64_t AutoSocketBufferBytes(int local_size, int64_t cache_bytes, int cpus);
// Processors online on this host (at least 1).
int OnlineCpus();

// Whether the background thread runs as SCHED_BATCH under `engine_sched` with `local_size` ranks on
// `cpus` processors. Ranks that outnumber the processors take turns on them, and every message
// of an exchange wakes a peer's thread; at the default policy the woken thread often preempts the
// sender on the spot, which then finishes its own exchange only after the peer's turn. As batch
// threads, woken peers wait for the sender to block, and an exchange whose messages are all
// there completes in one go. With a processor per rank nothing waits for a turn, and the default
// policy keeps its prompt wake-ups.
bool EngineThreadIsBatch(const std::string& engine_sched, int local_size, int cpus);
// The last-level cache the first core shares, in bytes (sysfs, else sysconf); 0 when unknown.
int64_t LastLevelCacheBytes();

// KOLO_* names in `env` that kolo does not know (likely misspellings); each is logged as a
// warning by OptionsFromEnvironment.
std::vector<std::string> UnknownKoloVariables(const std::map<std::string, std::string>& env);

// Parsers shared with the flag layer. Each error names `what` and the value.
StatusOr<int64_t> ParseInt(const std::string& what, const std::string& value, int64_t min,
                           int64_t max);
StatusOr<double> ParseDouble(const std::string& what, const std::string& value, double min,
                             double max);
StatusOr<bool> ParseBool(const std::string& what, const std::string& value);
StatusOr<LogLevel> ParseLogLevel(const std::string& value);
// "8,17,26" -> {8, 17, 26}; every item an integer in [0, 1 << 20]; empty -> {}.
StatusOr<std::vector<int>> ParseRankList(const std::string& what, const std::string& value);
// "64M", "1.5G", "4096", "256K" -> bytes (powers of 1024).
StatusOr<int64_t> ParseByteSize(const std::string& what, const std::string& value);
// A rate in bits per second as scripts/cluster takes a link's: a number and kbit, mbit or gbit
// ("125mbit"); "off" and "0" are 0. The error names `what`, the value and the allowed forms.
StatusOr<double> ParseBitRate(const std::string& what, const std::string& value);
// The rate as ParseBitRate reads it back: "125mbit", "1.5gbit", "off" for 0.
std::string FormatBitRate(double bits_per_s);

}  // namespace kolo
