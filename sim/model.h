// kolo-sim's performance model: the images/sec of one training configuration on hosts x GPUs per
// host, predicted from a replay profile (models/profiles/) and a calibration of the network and
// host costs, with the engine's own negotiation (coordinator::Controller and its response cache)
// and Tensor Fusion planner (fusion::PlanFusion) deciding what is sent when, and the
// parameter-server placement (backends::ps::Place) deciding where each tensor goes.
//
// What is modelled, per step, on one representative rank (every rank replays the same profile):
// - Compute: each layer's forward and backward time as recorded, times `compute_scale` (set from
//   --gpu-rate: the profile's single-GPU images/sec over the requested one), repeated for each
//   micro-batch; each gradient is submitted when its layer's backward on the last micro-batch ends.
//   Where the calibration (or the point) has a step_jitter, that compute is the expected slowest
//   rank's, whom every collective and so every rank waits for.
// - The engine thread (allreduce backends): cycles on the cycle-time grid; each cycle drains what
//   was submitted, negotiates (a bit-vector exchange, plus a coordinator round of gather and
//   broadcast for names the response cache does not hold, as the real Controller decides), plans
//   fusion groups with the real planner, and executes them one after another.
// - A collective: messages on a topology of hosts x GPUs per host. Each phase of an algorithm is a
//   set of flows; a phase takes the per-message latency plus the time of its most loaded link
//   (flows that share a link share its bandwidth: a NIC's egress and ingress, a GPU's intra-host
//   link), plus the per-byte host costs (copy, reduction). A ring's steps are not separated by
//   barriers, so its latency is that of the hops along it (NIC hops and intra-host hops in their
//   proportion), while its bytes go at the most loaded link's pace.
// - The engine's own time per cycle that executes something (calibration engine_overhead_us) and
//   per collective it executes (engine_collective_us), and ranks that share one machine's cores
//   (host_cores) slowing the host-bound costs. Within a host, kolo's own collectives move at
//   intra_large_gbytes_per_s where a step's gradients add up to intra_large_bytes or more: the
//   step cycles through all of them, so their bytes come from beyond the caches.
// - Parameter servers: pushes and pulls of each shard of the real placement, each a flow set on the
//   servers' links (N workers pushing to one server: incast), queued first come first served on
//   each server's link and each worker host's link; a shard's pull waits for the slowest worker's
//   push of it, the workers' streams sharing the server's link as unevenly as measured
//   (ps_stream_spread). Paced pushes (ps_pacing) go at no more than the pace each; paces that add
//   up to no more than the link share it evenly; beyond, the streams are as uneven as unpaced
//   ones, but the slowest keeps what the others' paces leave of the link.
// Times are seconds unless a name says otherwise.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/common/status.h"

namespace kolo::sim {

// The costs of one transport (kolo's tcp, rdma or shm, or the NCCL-like intra-host link).
struct TransportCosts {
  double latency_us = 0;         // per message (one ring step, one push, one negotiation hop)
  double efficiency = 1;         // achievable fraction of the link's line rate
  double copy_gbytes_per_s = 0;  // per-byte host cost (copies through the kernel); 0: none
  // The most one TCP connection carries, Gbit/s of payload (one congestion window, one core's
  // copies; the emulated cluster's --flow-cap); 0: no limit of its own. With S streams per pair
  // a host's link moves min(line rate x efficiency, S x this). TCP only.
  double stream_gbit = 0;
};

// The calibration: every parameter a prediction uses besides the point's settings. Read from a
// JSON file (sim/calibrations/, or written by `kolo-sim calibrate`).
struct Calibration {
  std::string name = "builtin";
  std::string source;     // where the values come from, in words
  double link_gbit = 25;  // NIC line rate per host when the point gives no link
  TransportCosts tcp{30, 0.9, 0};
  TransportCosts rdma{3, 0.97, 0};
  TransportCosts shm{2, 1, 0};     // kolo's ring between ranks of one host
  double intra_gbytes_per_s = 10;  // NCCL-like link of one GPU within its host (each direction)
  double intra_latency_us = 5;
  // kolo's own collectives within a host (not NCCL's): where the bytes a step cycles through (a
  // bench row's one buffer, a training step's gradients) add up to at least intra_large_bytes,
  // they move at intra_large_gbytes_per_s instead of intra_gbytes_per_s, the ranks' copies
  // slowing once the data no longer stays in the caches (`kolo-sim calibrate`'s size regimes). 0:
  // one rate for every size.
  double intra_large_bytes = 0;
  double intra_large_gbytes_per_s = 0;
  double reduce_gbytes_per_s = 20;       // summing received bytes into the buffer
  double fusion_copy_gbytes_per_s = 20;  // copying tensors into and out of the fusion buffer
  // Whether a parameter server's link moves pushes and pulls at the same time (each shard's pull
  // still waits for every worker's push of it); false: they take turns on one queue.
  bool ps_full_duplex = true;
  // How unevenly the streams of a server's workers share its link (TCP flows into one link do not
  // get equal shares): the slowest stream moves at (1 - spread) of a fair share while the others
  // still send, and a shard's pull waits for every worker's push of it. Per number of streams, as
  // scripts/cluster-incast measures it (its ps_stream_spread; with --rounds, in a parameter
  // server's synchronous rounds, which share a link far less evenly than a continuous incast);
  // between measured counts
  // interpolated in log2 of the count, beyond them the nearest one's. Empty: fair shares. Used
  // with ps_full_duplex.
  std::map<int, double> ps_stream_spread;
  // How much of that spread is left when each worker's pushes are paced (ps_pacing) at r times a
  // fair share of the server's link, r > 1: the share at each measured r, as scripts/cluster-incast
  // --pace measures it (its ps_stream_spread paced over unpaced, at one worker count), interpolated
  // in log2 of r from none at r = 1 (streams that cannot outrun one another) to all of it at r =
  // the stream count (a pace of the whole link). Empty: all of it. Either way the slowest stream
  // keeps what the others' paces leave of the link.
  std::map<double, double> ps_paced_spread_share;
  // Cores shared by every rank of the prediction, where all of them run on one machine (ranks on
  // loopback, or the emulated cluster's hosts); 0: each host has cores enough for its ranks. With
  // more ranks than cores, the host-bound costs (the intra-host link's rate and latency, the
  // reduction, the fusion copies) slow by ranks / host_cores; the NIC's wire does not.
  double host_cores = 0;
  // What the engine spends in each cycle that executes something, besides the collectives' own
  // messages (waking its thread and the threads that wait, handing tensors over): `kolo-sim
  // calibrate` reads it from kolo-allreduce-bench's ring rows (one collective per cycle) against
  // its link rows. Host-bound, like the reduction.
  double engine_overhead_us = 0;
  // What the engine spends on each collective it executes, besides its messages (completing its
  // handles, stepping the pipeline): `kolo-sim calibrate` reads it from kolo-allreduce-bench
  // --tensors step rows, fusion off against on. Host-bound, like the reduction.
  double engine_collective_us = 0;
  // How much one rank's compute varies from step to step: the coefficient of variation (standard
  // deviation over mean) of its step time when it trains alone, as a one-rank kolo-train run
  // record gives it (images_per_sec_stddev over images_per_sec_per_rank; `kolo-sim calibrate
  // --jitter`). A synchronous step waits for its slowest rank: with N ranks whose step times vary
  // independently and normally, the gradients are ready everywhere, and the step ends, as late as
  // the expected slowest of N, compute x (1 + step_jitter x ExpectedMaxOfNormals(N)) (0.56 x
  // step_jitter more at 2 ranks, 2.59 x at 128). 0: every rank's steps alike.
  double step_jitter = 0;
  // Interference: how much slower compute runs while communication runs beside it (on a GPU,
  // NCCL's kernels take SMs and memory bandwidth, host staging shares PCIe; on a CPU, the copies
  // share cores), as a fraction: the backward pass is stretched by interference times the share
  // of it that communication overlaps (Predict's Interference stage). 0: none.
  double interference = 0;
};

// The largest interference a calibration may give.
inline constexpr double kMaxInterference = 1.0;

// The most kolo-sim reads of any one file it is given (calibrations, kolo-allreduce-bench
// documents, run records, incast summaries; the replay profile's bound too): every one is read
// through ReadFileBounded (engine/common/file.h), so a FIFO, a device or a huge file named by
// mistake is an error naming it, not a hang or memory without end.
inline constexpr size_t kMaxInputFileBytes = size_t{64} << 20;

StatusOr<Calibration> CalibrationFromJson(const std::string& text, const std::string& origin);
// Reads and checks the calibration in `path` (a regular file of at most kMaxInputFileBytes).
StatusOr<Calibration> LoadCalibration(const std::string& path);
std::string CalibrationToJson(const Calibration& c);

// One configuration to predict.
struct Point {
  std::string model;    // zoo name: the gradients' sizes and order
  std::string profile;  // replay profile path: the layer times
  int64_t batch_size = 0;
  double gpu_rate = 0;  // single-GPU images/sec to scale the profile to; 0: the profile's own
  int ranks = 1;
  int ranks_per_host = 1;
  std::string backend = "ring";  // ring | nccl | mpi | ps | none
  bool hierarchical = false;     // ring, nccl: reduce within hosts, allreduce across, gather
  // ring backend: auto | ring | recursive-doubling | halving-doubling | one-shot (the engine's
  // KOLO_ALLREDUCE_ALGORITHM); nccl and mpi run their own (modelled as the ring).
  std::string allreduce_algorithm = "auto";
  // The engine's gradient compression (KOLO_COMPRESSION): none | fp16 | bf16. Compressed, every
  // allreduce moves half its bytes, each group is cast in and out (at the fusion copy rate; the
  // cast replaces a fused group's copies) and the reduction sums half elements at float32's
  // per-element rate (assumed: sim/calibrations/README.md); parameter-server pushes move half.
  std::string compression = "none";
  std::string transport = "tcp";  // tcp | rdma (between hosts); auto = tcp
  // The transport was auto or shm: ranks of one host talk over shared memory, and a job all on
  // one host maps the host area of the one-shot allreduce (Network::host_area).
  bool shm_within_host = false;
  // TCP connections per pair (the engine's KOLO_TCP_STREAMS; 0 = auto, taken as 1: kolo-sim
  // knows no NIC to read a speed from).
  int tcp_streams = 1;
  double link_gbit = 0;  // NIC line rate; 0: the calibration's
  double dilation = 1;   // the emulated cluster's time dilation (see SCHEMA.md)
  double fusion_threshold_mb = 64;
  double cycle_time_ms = 1;
  int backward_passes_per_step = 1;
  int ps_servers = 1;
  std::string ps_placement = "greedy";
  bool ps_on_worker_hosts = false;  // servers share worker hosts instead of hosts of their own
  // The cap on each worker's pushes to each server, bits/s on the wire (kolo-train --ps-pacing;
  // under dilation K, like the link, it stands for K times as much); 0: unpaced.
  double ps_pacing_bits_per_s = 0;
  int steps = 3;  // steps simulated; the last is reported (the first fills caches)
  // The calibration's step_jitter for this point (--step-jitter); < 0: the calibration's own.
  double step_jitter = -1;
  // When the step's updates run (FrameworkStage in model.cc): kolo (each parameter once its own
  // collective is done, in backprop order), horovod-tf (TensorFlow applies the step's updates
  // after every allreduce of the step), ddp (PyTorch DDP: gradients in buckets of 25 MiB, the
  // first 1 MiB, in the order backward makes them, each allreduced once all its gradients are
  // ready, in bucket order, with no negotiation; the optimizer after every bucket).
  std::string framework = "kolo";
  // Split the exposed communication by cause (Prediction::exposed_*_ms): three more runs of the
  // communication stage, each with one more cost taken away.
  bool exposed_by_cause = false;
};

// The frameworks a prediction can take the update semantics of (Point::framework).
inline constexpr const char* kFrameworks[] = {"kolo", "horovod-tf", "ddp"};
// PyTorch DistributedDataParallel's bucket sizes (bucket_cap_mb = 25; the first bucket 1 MiB).
inline constexpr double kDdpBucketBytes = 25.0 * (1 << 20);
inline constexpr double kDdpFirstBucketBytes = 1.0 * (1 << 20);

struct Prediction {
  double step_ms = 0;
  double total_images_per_sec = 0;
  double images_per_sec_per_rank = 0;
  double forward_ms = 0, backward_ms = 0, exposed_comm_ms = 0, update_ms = 0;
  // What interference added to backward_ms (0 without it): the reported backward is stretched.
  double interference_ms = 0;
  double comm_ms = 0, negotiation_ms = 0;
  double comm_bytes_per_step = 0;
  double collectives_per_step = 0, cycles_per_step = 0, cycle_hold_ms = 0;
  double coordinator_rounds = 0;         // in the reported step
  double single_gpu_images_per_sec = 0;  // compute alone, batch / (forward + backward + update)
  int hosts = 1;
  // Point::exposed_by_cause: exposed_comm_ms split by what it would lose were each cost taken
  // away in turn (each removal kept for the next; they add up to exposed_comm_ms):
  //   coordination: the negotiation, the cycle grid's hold and the engine's own work per cycle
  //                 and per collective (allreduce backends through the engine only);
  //   latency:      every hop's latency (NIC and within the host);
  //   host:         the host's per-byte work: reductions, fusion copies and casts, the
  //                 transports' copies, a parameter-server worker's copy of what it pulls;
  //   wire:         what is left: bytes over the links' bandwidth.
  // A removal can let the engine group gradients otherwise, so a cause can come out slightly
  // negative. Negative (-1) where not asked for.
  double exposed_coordination_ms = -1, exposed_latency_ms = -1, exposed_host_ms = -1,
         exposed_wire_ms = -1;
};

// ---- The network model, exposed for tests. ----

// A message from rank `src` to rank `dst` (ranks numbered host-major: host = rank / per_host).
struct Flow {
  int src = 0;
  int dst = 0;
  double bytes = 0;
};

// The links of a topology and what one step of messages over them costs.
struct Network {
  int hosts = 1;
  int per_host = 1;
  double nic_bytes_per_s = 0;  // achievable, per direction per host, by the point's streams
  // The link's payload rate with enough streams (nic_bytes_per_s before the per-stream cap), and
  // that cap per stream (0: none): a link that S streams share carries
  // min(link, S x stream) (NicRate). Parameter servers' links carry a stream per worker.
  double nic_link_bytes_per_s = 0;
  double nic_stream_bytes_per_s = 0;
  double nic_latency_s = 0;
  double nic_copy_bytes_per_s = 0;  // 0: no per-byte host cost
  double intra_bytes_per_s = 0;     // per GPU, each direction
  double intra_latency_s = 0;
  double intra_copy_bytes_per_s = 0;
  // The ranks of a host talk over kolo's shared memory and map a host-wide area: on one host the
  // rule may pick the one-shot allreduce (collectives::ChooseAllreduceAlgorithm); across hosts,
  // hierarchical allreduce runs small buffers one-shot within each host.
  bool host_area = false;
};

// What a host's link carries per direction when `streams` TCP streams share it: the link's rate,
// or less where each stream is capped (Network::nic_stream_bytes_per_s).
double NicRate(const Network& net, int streams);

// The time of one phase in which every flow runs at once: the latency of the slowest kind of hop
// used, plus the most loaded link's bytes over its bandwidth, plus the largest per-rank host cost.
double PhaseTime(const Network& net, const std::vector<Flow>& flows);

// Collective algorithms: the time to allreduce `bytes` over the ranks of `net`.
double RingAllreduceTime(const Network& net, double bytes, double reduce_bytes_per_s);
double HierarchicalAllreduceTime(const Network& net, double bytes, double reduce_bytes_per_s);
// The latency-optimal allreduces as kolo runs them (engine/collectives/latency.cc): steps that
// each wait for their exchange, every rank's message of a step at once (PhaseTime), with the fold
// of a rank count that is not a power of two before and after. Recursive doubling swaps the
// whole buffer log2 p times and sums each; halving-doubling moves halves, quarters, ... and back.
double RecursiveDoublingAllreduceTime(const Network& net, double bytes, double reduce_bytes_per_s);
double HalvingDoublingAllreduceTime(const Network& net, double bytes, double reduce_bytes_per_s);
// The one-shot allreduce through the host area (engine/collectives/one_shot.cc), per piece of
// the host area's slot (transport::shm::HostArea::kDefaultSlotBytes): one step's latency within the
// host (the wait for the last rank), the piece copied into the area and the sum out of it, which
// reads every rank's slot (N - 1 additions of the piece). Only on one host (net.host_area).
double OneShotAllreduceTime(const Network& net, double bytes, double reduce_bytes_per_s);
// The time of the allreduce algorithm `algorithm` (Options::allreduce_algorithm's names; "auto"
// picks by collectives::ChooseAllreduceAlgorithm, as the engine does) over `net`, flat or, for
// the ring, hierarchical. Sets *ran to the algorithm that runs when ran is not null.
double AllreduceTime(const Network& net, double bytes, double reduce_bytes_per_s,
                     const std::string& algorithm, bool hierarchical, std::string* ran = nullptr);

// The calibration's ps_stream_spread for `streams` streams into one link (0 for fewer than 2).
double StreamSpread(const Calibration& cal, int streams);

// The spread left of `streams` streams paced at `ratio` times a fair share: StreamSpread times the
// calibration's ps_paced_spread_share, and no more than the others' paces leave of the link.
double PacedStreamSpread(const Calibration& cal, int streams, double ratio);

// The expected largest of n independent standard normal draws (0 for n = 1; 1/sqrt(pi) for 2):
// how many standard deviations the slowest of n ranks' step times lies above their mean.
// REQUIRES: n >= 1.
double ExpectedMaxOfNormals(int n);

// How many times slower the host-bound costs of `point` run: ranks / cal.host_cores where the
// calibration names shared cores and the ranks outnumber them, else 1.
double HostShare(const Point& point, const Calibration& cal);

// The network of `point` under `cal`; `working_bytes`: what a step cycles through (its gradients),
// which sets the intra-host rate where the calibration has size regimes (0: the small-buffer rate).
Network MakeNetwork(const Point& point, const Calibration& cal, double working_bytes = 0);

// Predicts `point`. Errors name the model, profile or setting at fault.
StatusOr<Prediction> Predict(const Point& point, const Calibration& cal);

}  // namespace kolo::sim
