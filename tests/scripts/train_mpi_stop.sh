#!/usr/bin/env bash
# A rank that hangs instead of dying ends an mpirun job: SIGSTOP rank 2 of a 3-rank run (replay
# compute) after its first steps, with the ring backend and with the MPI backend. Ring: the
# survivors' collectives time out after the peer timeout (5 s), they fail, and the failed ranks
# abort the MPI job (MPI_Abort) instead of waiting in MPI_Finalize for the stopped rank for ever.
# MPI: the backend's watchdog aborts the job once a blocking MPI collective has outlived the peer
# timeout. Either way mpirun exits non-zero within a bound and nothing of the job is left, the
# stopped rank included.
# Usage: train_mpi_stop.sh BIN_DIR. Exit 77 (skip) without kolo-train, mpirun or the build's MPI.
set -euo pipefail

bin=${1:?usage: train_mpi_stop.sh BIN_DIR}
train=$bin/kolo-train
root=$(cd "$(dirname "$0")/../.." && pwd)
[[ -x $train ]] || { echo "skip: $train not built"; exit 77; }
command -v mpirun >/dev/null || { echo "skip: mpirun not found"; exit 77; }
grep -q "KOLO_HAVE_MPI 1" "$bin/../generated/kolo/config.h" 2>/dev/null ||
  { echo "skip: this build has no MPI"; exit 77; }

work=$(mktemp -d)
# shellcheck source=tests/scripts/lib/job.bash
source "$(dirname "$0")/lib/job.bash"
trap 'job_cleanup "--json $work/run.json"; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; [[ -f $work/out ]] && cat "$work/out"; exit 1; }

for backend in ring mpi; do
  rm -f "$work/run.json"
  job_start mpirun --oversubscribe --allow-run-as-root --mca btl self,tcp \
    --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -np 3 "$train" --model resnet101 \
    --batch-size 64 --compute replay --profile "$root/models/profiles/resnet101-h100-b64.json" \
    --num-warmup-batches 1 --num-batches 100000 --display-every 5 --peer-timeout-s 5 \
    --backend "$backend" --json "$work/run.json"
  job_wait_step "$backend"
  victim=$(job_rank_pid "--json $work/run.json" OMPI_COMM_WORLD_RANK=2)
  [[ -n $victim ]] || fail "$backend: rank 2 not found"
  kill -STOP "$victim"
  job_wait_exit 60 "$backend (peer timeout 5 s)"
  echo "$backend: mpirun exited $rc, ${SECONDS} s after rank 2 was stopped"
  [[ $rc != 0 ]] || fail "$backend: mpirun exited 0 although a rank stopped answering"
  # The host area's waits (one host over shared memory) say which ranks "have not published".
  grep -q "waited\|timed out\|nothing completed\|still blocked after\|has not published" "$work/out" ||
    fail "$backend: no survivor reported the timeout"
  sleep 1
  left=$(pgrep -f -- "--json $work/run.json" || true)
  [[ -z $left ]] || fail "$backend: processes left after the job ended: $left"
done
echo "PASS"
