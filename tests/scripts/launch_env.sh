#!/usr/bin/env bash
# Ranks started by launchers other than mpirun and kolo-run find their place and meet without
# extra flags: kolo-train processes started here by hand with the variables Slurm's srun sets
# (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_TASKS_PER_NODE,
# SLURM_STEP_NODELIST, SLURM_JOB_ID), and with those MPICH's and Intel MPI's Hydra sets (PMI_RANK,
# PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS), train together: rank 0 serves the rendezvous store on
# the step's first node (here 127.0.0.1, which resolves even where /etc/hosts does not name
# localhost, as in a bare chroot) or at KOLO_STORE_ADDR. Then: no KOLO_JOB_SECRET is refused
# naming it, Hydra without KOLO_STORE_ADDR is refused naming it, a malformed SLURM_* value is
# named, and kolo-run refuses a host list (it is not a cluster launcher).
# Usage: launch_env.sh BIN_DIR   (exit 77 = skipped)
set -euo pipefail

bin=${1:?usage: launch_env.sh BIN_DIR}
train=$bin/kolo-train
root=$(cd "$(dirname "$0")/../.." && pwd)
profile=$root/models/profiles/resnet101-h100-b64.json
[[ -x $train && -x $bin/kolo-run ]] || { echo "SKIP: kolo-train or kolo-run not built"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 is needed"; exit 77; }

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Every launch variable a surrounding launcher may have set is removed from the ranks' environment.
clean_env=(env -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_LOCAL_SIZE
           -u OMPI_COMM_WORLD_LOCAL_RANK -u KOLO_SIZE -u KOLO_RANK -u KOLO_LOCAL_SIZE
           -u KOLO_LOCAL_RANK -u KOLO_STORE_ADDR -u KOLO_JOB_SECRET -u PMI_RANK -u PMI_SIZE)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
secret=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
common=(--model resnet101 --batch-size 64 --compute replay --profile "$profile"
        --num-warmup-batches 1 --num-batches 3 --display-every 3 --peer-timeout-s 30)

# wait_all NAME: waits for the started ranks (each bounded by `timeout`), all must exit 0.
wait_all() {
  local name=$1 rc=0 p
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  pids=()
  ((rc == 0)) || { cat "$work"/"$name".*.out; fail "$name: a rank exited non-zero ($rc)"; }
}

# --- srun: 3 ranks, the store on the step's first node (127.0.0.1) at KOLO_STORE_PORT.
port=$(free_port)
for r in 0 1 2; do
  "${clean_env[@]}" SLURM_PROCID=$r SLURM_STEP_NUM_TASKS=3 SLURM_LOCALID=$r SLURM_NODEID=0 \
    SLURM_STEP_TASKS_PER_NODE=3 SLURM_STEP_NODELIST=127.0.0.1 SLURM_JOB_ID=4242 SLURM_STEP_ID=0 \
    KOLO_STORE_PORT=$port KOLO_JOB_SECRET=$secret \
    timeout 120 "$train" "${common[@]}" --json "$work/srun.$r.json" >"$work/srun.$r.out" 2>&1 &
  pids+=($!)
done
wait_all srun
python3 - "$work/srun.0.json" 3 <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["settings"]["ranks"] == int(sys.argv[2]), r["settings"]
assert r["results"]["total_images_per_sec"] > 0, r["results"]
print("srun-style launch: ranks", r["settings"]["ranks"], "images/sec", r["results"]["total_images_per_sec"])
PY

# --- Hydra: 2 ranks, the store at KOLO_STORE_ADDR.
port=$(free_port)
for r in 0 1; do
  "${clean_env[@]}" PMI_RANK=$r PMI_SIZE=2 MPI_LOCALRANKID=$r MPI_LOCALNRANKS=2 \
    KOLO_STORE_ADDR=127.0.0.1:$port KOLO_JOB_SECRET=$secret \
    timeout 120 "$train" "${common[@]}" --json "$work/hydra.$r.json" >"$work/hydra.$r.out" 2>&1 &
  pids+=($!)
done
wait_all hydra
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["settings"]["ranks"] == 2, r' \
  "$work/hydra.0.json"
echo "hydra-style launch: 2 ranks trained"

# --- refusals, each at start-up with exit 2 and the variable named.
refused() {  # refused NAME PATTERN ENV...: kolo-train with ENV must exit 2 printing PATTERN
  local name=$1 pattern=$2 rc=0
  shift 2
  "${clean_env[@]}" "$@" timeout 60 "$train" "${common[@]}" >"$work/$name.out" 2>&1 || rc=$?
  ((rc == 2)) || { cat "$work/$name.out"; fail "$name: exit $rc, expected 2"; }
  grep -q -- "$pattern" "$work/$name.out" || { cat "$work/$name.out"; fail "$name: no '$pattern'"; }
  echo "refused as expected ($name): $(grep -m1 -- "$pattern" "$work/$name.out")"
}
slurm=(SLURM_PROCID=0 SLURM_STEP_NUM_TASKS=2 SLURM_LOCALID=0 SLURM_NODEID=0
       SLURM_STEP_TASKS_PER_NODE=2 SLURM_STEP_NODELIST=127.0.0.1 SLURM_JOB_ID=1)
refused no-secret "KOLO_JOB_SECRET is not set" "${slurm[@]}" KOLO_STORE_PORT="$(free_port)"
refused hydra-no-addr "KOLO_STORE_ADDR" PMI_RANK=0 PMI_SIZE=2 KOLO_JOB_SECRET="$secret"
refused bad-tasks "SLURM_STEP_TASKS_PER_NODE='2(y3)'" "${slurm[@]}" SLURM_STEP_TASKS_PER_NODE='2(y3)' \
  KOLO_JOB_SECRET="$secret"

rc=0
"$bin/kolo-run" -np 2 -H a:1,b:1 true >"$work/kolo-run.out" 2>&1 || rc=$?
((rc == 2)) && grep -q "not a cluster launcher" "$work/kolo-run.out" ||
  { cat "$work/kolo-run.out"; fail "kolo-run -H: exit $rc"; }
echo "PASS"
