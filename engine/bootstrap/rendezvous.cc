#include "engine/bootstrap/rendezvous.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "engine/common/crypto.h"
#include "engine/common/launch_env.h"
#include "engine/common/logging.h"
#include "engine/common/random.h"
#include "kolo/config.h"

#if KOLO_HAVE_MPI
#include "engine/bootstrap/mpi/mpi_env.h"
#endif

namespace kolo::bootstrap {
namespace {

// The only place that knows whether this build has MPI: everything below calls these two.
#if KOLO_HAVE_MPI
Status MpiStart(const Options& options) {
  KOLO_RETURN_IF_ERROR(mpi::EnsureInitialized());
  mpi::FinalizeAtExit();
  return mpi::CheckWorld(options.rank, options.size);
}
Status MpiBroadcastFromRoot(std::string* data) { return mpi::BroadcastString(data, 0); }
Status MpiGatherToRoot(const std::string& mine, std::vector<std::string>* all) {
  return mpi::GatherFixed(mine, 0, all);
}
#else
Status MpiStart(const Options&) {
  return FailedPrecondition(
      "launched by mpirun (OMPI_COMM_WORLD_SIZE is set), but this build of kolo has no MPI: "
      "rebuild with MPI (libopenmpi-dev) or launch with kolo-run");
}
Status MpiBroadcastFromRoot(std::string*) { return MpiStart(Options()); }
Status MpiGatherToRoot(const std::string&, std::vector<std::string>*) {
  return MpiStart(Options());
}
#endif

std::chrono::milliseconds PeerTimeout(const Options& options) {
  return std::chrono::milliseconds(static_cast<int64_t>(options.peer_timeout_s * 1000.0));
}

// What the key that seals the secret for one rank is for (HKDF's info), and the associated data
// that binds the sealed secret to the store's address and the rank it is for.
constexpr char kSecretPurpose[] = "kolo mpirun job secret v1";
std::string SecretAad(const std::string& addr, int rank) {
  return fmt::format("{} rank {}", addr, rank);
}

// Under mpirun: rank 0 serves the store and tells everyone where it is and what the secret is.
// MPI's channel is plain text (Open MPI's TCP transport sends what it is given), so the secret
// travels only sealed: every rank sends rank 0 an X25519 public key (a gather); rank 0 seals the
// secret for each rank under the key the two agree (HKDF-SHA-256 of the shared secret, then
// ChaCha20-Poly1305) and broadcasts "ok <store address> <its public key> <sealed for rank 1> ...".
// A passive observer sees public keys and ciphertexts only (engine/docs/wire.md).
Status StartOverMpi(const Options& options, Rendezvous* rv) {
#if KOLO_HAVE_MPI
  std::optional<mpi::StartupWatchdog> watchdog;
  watchdog.emplace(
      std::max(PeerTimeout(options),
               std::chrono::milliseconds(static_cast<int64_t>(options.start_timeout_s * 1000.0))),
      options.rank,
      "MPI start-up (MPI_Init and the rendezvous broadcast; KOLO_START_TIMEOUT_SECONDS)");
#endif
  KOLO_RETURN_IF_ERROR(MpiStart(options));
  // A rank whose key generation failed still takes part (an all-zero key, which rank 0 refuses
  // for that rank alone), so that no rank waits in a collective forever.
  auto key = X25519Key::Generate();
  const X25519Key::PublicKey mine = key.ok() ? key->public_key() : X25519Key::PublicKey{};
  std::vector<std::string> keys;
  KOLO_RETURN_IF_ERROR(
      MpiGatherToRoot(std::string(reinterpret_cast<const char*>(mine.data()), mine.size()), &keys));
  std::string payload;
  if (options.rank == 0) {
    // A failure on rank 0 still goes through the broadcast, so that no rank waits in it forever.
    TcpStoreServerOptions so;
    so.host = rv->listen_addr;
    so.secret = options.job_secret.empty() ? GenerateSecret() : options.job_secret;
    auto server = key.ok() ? TcpStoreServer::Start(so)
                           : StatusOr<std::unique_ptr<TcpStoreServer>>(key.status());
    if (server.ok()) {
      rv->server = std::move(server).value();
      rv->secret = so.secret;
      const std::string addr = rv->server->address();
      payload = "ok " + addr + " " + Hex(mine.data(), mine.size());
      for (size_t r = 1; r < keys.size(); ++r) {
        X25519Key::PublicKey theirs{};
        std::memcpy(theirs.data(), keys[r].data(), theirs.size());
        auto agreed = key->Agree(theirs, mine, theirs, kSecretPurpose);
        auto sealed = agreed.ok()
                          ? SealOnce(*agreed, SecretAad(addr, static_cast<int>(r)), so.secret)
                          : StatusOr<std::string>(agreed.status());
        // A rank whose key is unusable gets "-" and fails with the reason on its side.
        payload += " " + (sealed.ok() ? Hex(sealed->data(), sealed->size()) : std::string("-"));
      }
    } else {
      payload = "error " + server.status().ToString();
    }
  }
  KOLO_RETURN_IF_ERROR(MpiBroadcastFromRoot(&payload));
#if KOLO_HAVE_MPI
  watchdog.reset();  // the rest is bounded by the peer timeout itself
#endif
  if (payload.rfind("error ", 0) == 0) {
    return Unavailable("rank 0 could not start the rendezvous store: {}", payload.substr(6));
  }
  std::vector<std::string> fields;
  for (size_t at = 0; at <= payload.size();) {
    const size_t sp = std::min(payload.find(' ', at), payload.size());
    fields.push_back(payload.substr(at, sp - at));
    at = sp + 1;
  }
  if (fields.size() != static_cast<size_t>(options.size) + 2 || fields[0] != "ok") {
    return Internal("malformed rendezvous broadcast from rank 0 ({} bytes, {} fields for {} ranks)",
                    payload.size(), fields.size(), options.size);
  }
  const std::string& addr = fields[1];
  if (options.rank != 0) {
    KOLO_RETURN_IF_ERROR(
        key.status().WithContext(fmt::format("rank {}: the key for the job secret", options.rank)));
    std::string root_key;
    std::string sealed;
    const std::string& entry = fields[static_cast<size_t>(options.rank) + 2];
    if (!FromHex(fields[2], &root_key) || root_key.size() != 32 || entry == "-" ||
        !FromHex(entry, &sealed)) {
      return ProtocolError(
          "rank 0 sent rank {} no usable sealed job secret (its key or this rank's was refused)",
          options.rank);
    }
    X25519Key::PublicKey root{};
    std::memcpy(root.data(), root_key.data(), root.size());
    KOLO_ASSIGN_OR_RETURN(const Digest agreed, key->Agree(root, root, mine, kSecretPurpose));
    auto secret = OpenOnce(agreed, SecretAad(addr, options.rank), sealed);
    if (!secret.ok()) {
      return secret.status().WithContext(
          fmt::format("rank {}: opening the job secret rank 0 sealed for it", options.rank));
    }
    rv->secret = std::move(secret).value();
  }
  KOLO_ASSIGN_OR_RETURN(auto client,
                        TcpStoreClient::Connect(addr, rv->secret, PeerTimeout(options)));
  rv->store = client.get();
  rv->owned_store = std::move(client);
  return Status::OK();
}

// Under srun and Hydra: rank 0 serves the store at options.serve_store_addr (a name or address
// of its own host, and a port), every rank connects to it there; the secret comes from the
// environment, since nothing else can carry it to every rank.
Status StartServedStore(const Options& options, Rendezvous* rv) {
  const std::string& addr = options.serve_store_addr;
  KOLO_RETURN_IF_ERROR(
      RequireServedStoreSecret(options.launcher, options.serve_store_addr, options.job_secret));
  rv->secret = options.job_secret;
  KOLO_ASSIGN_OR_RETURN(const sockaddr_in sa, ResolveHostPort(addr));
  const std::string resolved = FormatAddress(sa);
  const auto timeout =
      std::max(PeerTimeout(options),
               std::chrono::milliseconds(static_cast<int64_t>(options.start_timeout_s * 1000.0)));
  if (options.rank == 0) {
    TcpStoreServerOptions so;
    so.host = resolved.substr(0, resolved.rfind(':'));
    so.port = ntohs(sa.sin_port);
    so.secret = rv->secret;
    auto server = TcpStoreServer::Start(so);
    if (!server.ok()) {
      return server.status().WithContext(fmt::format(
          "rank 0 serves the rendezvous at {} ({}), which must be an address of its own host and "
          "a free port (set KOLO_STORE_ADDR=host:port{})",
          addr, resolved, options.launcher == "srun" ? ", or KOLO_STORE_PORT" : ""));
    }
    rv->server = std::move(server).value();
  }
  auto client = TcpStoreClient::Connect(resolved, rv->secret, timeout);
  if (!client.ok()) {
    return client.status().WithContext(
        fmt::format("the rendezvous store that rank 0 serves at {} ({})", addr, resolved));
  }
  rv->store = client->get();
  rv->owned_store = std::move(client).value();
  return Status::OK();
}

}  // namespace

std::string GenerateSecret() {
  uint8_t bytes[16] = {};
  if (!FillRandom(bytes, sizeof(bytes))) {
    // No kernel randomness at all: refuse to run with a guessable secret.
    KOLO_LOG(kError, "neither getrandom nor /dev/urandom is usable; cannot make a job secret");
    std::abort();
  }
  std::string hex;
  hex.reserve(32);
  for (uint8_t b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

StatusOr<Rendezvous> StartRendezvous(const Options& options, Store* external) {
  Rendezvous rv;
  KOLO_ASSIGN_OR_RETURN(rv.listen_addr, ResolveListenAddress(options));

  if (external != nullptr) {
    // Threads sharing one store must agree on the secret without talking; the store's identity,
    // salted once per process, gives them a common value that other processes cannot predict.
    static const std::string salt = GenerateSecret().substr(0, 16);
    rv.store = external;
    rv.secret = !options.job_secret.empty()
                    ? options.job_secret
                    : fmt::format("{}{:016x}", salt, reinterpret_cast<uintptr_t>(external));
    return rv;
  }

  if (!options.serve_store_addr.empty()) {
    Status s = StartServedStore(options, &rv);
    if (!s.ok()) return s.WithContext(fmt::format("rank {}", options.rank));
    return rv;
  }

  if (!options.store_addr.empty()) {
    if (options.job_secret.empty()) {
      return InvalidArgument(
          "KOLO_STORE_ADDR={} is set but KOLO_JOB_SECRET is not: the store only serves clients "
          "that prove they know the job's secret (kolo-run sets both)",
          options.store_addr);
    }
    rv.secret = options.job_secret;
    auto client = TcpStoreClient::Connect(options.store_addr, rv.secret, PeerTimeout(options));
    if (!client.ok()) return client.status().WithContext(fmt::format("rank {}", options.rank));
    rv.store = client->get();
    rv.owned_store = std::move(client).value();
    return rv;
  }

  if (options.launched_by_mpirun) {
    Status s = StartOverMpi(options, &rv);
    if (!s.ok()) return s.WithContext(fmt::format("rank {}: rendezvous over MPI", options.rank));
    return rv;
  }

  if (options.size == 1) {
    rv.secret = options.job_secret.empty() ? GenerateSecret() : options.job_secret;
    rv.owned_store = std::make_unique<InMemoryStore>();
    rv.store = rv.owned_store.get();
    return rv;
  }

  return InvalidArgument(
      "size={} but no launcher was found: start several ranks with mpirun (e.g. `mpirun -np {} "
      "PROGRAM`), srun, mpiexec (MPICH, Intel MPI) or kolo-run (`kolo-run -np {} PROGRAM`), "
      "which tell each rank where it is",
      options.size, options.size, options.size);
}

}  // namespace kolo::bootstrap
