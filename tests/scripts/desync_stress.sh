#!/usr/bin/env bash
# Ranks in step under load: 4-rank kolo-train jobs (ResNet-101, replay compute, 5 steps) under
# mpirun beside two busy loops on the host, for the ring, mpi and ps backends, each run bounded.
# Every run must finish with exit 0 and a total line; a failed run prints its output. The step
# check (engine/docs/negotiation.md) fails any run whose ranks would run different collectives,
# so a run that ends cleanly was also in step.
# Usage: desync_stress.sh BIN_DIR [--runs N] [--backends "ring mpi ps"]
#   default 2 runs per backend (CI's slice); scripts/stress runs 30.
# Exit 77 (skip) without kolo-train, mpirun or the build's MPI.
set -euo pipefail

bin=${1:?usage: desync_stress.sh BIN_DIR [--runs N] [--backends LIST]}
shift
runs=2
backends="ring mpi ps"
while (($#)); do
  case $1 in
    --runs) runs=${2:?--runs needs a number}; shift ;;
    --backends) backends=${2:?--backends needs a list}; shift ;;
    *) echo "desync_stress.sh: unknown argument '$1' (allowed: --runs N, --backends LIST)" >&2; exit 2 ;;
  esac
  shift
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "desync_stress.sh: --runs '$runs' is not a positive number" >&2; exit 2; }
train=$bin/kolo-train
root=$(cd "$(dirname "$0")/../.." && pwd)
[[ -x $train ]] || { echo "skip: $train not built"; exit 77; }
command -v mpirun >/dev/null || { echo "skip: mpirun not found"; exit 77; }
grep -q "KOLO_HAVE_MPI 1" "$bin/../generated/kolo/config.h" 2>/dev/null ||
  { echo "skip: this build has no MPI"; exit 77; }

work=$(mktemp -d)
busy=()
cleanup() {
  ((${#busy[@]})) && kill "${busy[@]}" 2>/dev/null
  pkill -f -- "--json $work/" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
# Two busy loops: with 4 ranks on 2 cores every rank is descheduled often, mid-collective too.
for _ in 1 2; do
  bash -c 'end=$((SECONDS + 3600)); while ((SECONDS < end)); do :; done' &
  busy+=($!)
done

mpi=(mpirun --oversubscribe --allow-run-as-root --mca btl self,tcp --mca btl_tcp_if_include lo
     --mca oob_tcp_if_include lo --bind-to none -np 4)
failures=0
summary=()
for backend in $backends; do
  case $backend in
    ring | mpi) engine=(--backend "$backend") ;;
    ps) engine=(--backend ps --ps-servers 1) ;;
    *) echo "desync_stress.sh: backend '$backend' (allowed: ring, mpi, ps)" >&2; exit 2 ;;
  esac
  ok=0 worst=0
  for ((i = 1; i <= runs; i++)); do
    start=$SECONDS
    rc=0
    timeout -k 5 240 "${mpi[@]}" "$train" --model resnet101 --batch-size 64 --compute replay \
      --profile "$root/models/profiles/resnet101-h100-b64.json" --num-warmup-batches 1 \
      --num-batches 5 --display-every 5 "${engine[@]}" --json "$work/run.json" \
      >"$work/out" 2>&1 || rc=$?
    seconds=$((SECONDS - start))
    ((seconds > worst)) && worst=$seconds
    if ((rc == 0)) && grep -q '^total images/sec' "$work/out"; then
      ok=$((ok + 1))
    else
      failures=$((failures + 1))
      echo "FAIL: $backend run $i exited $rc after $seconds s:"
      tail -30 "$work/out"
    fi
  done
  summary+=("$backend: $ok/$runs runs ok, longest $worst s")
  echo "${summary[-1]}"
done
printf '%s\n' "${summary[@]}"
echo "$failures failed runs"
((failures == 0)) && echo PASS
exit $((failures > 0))
