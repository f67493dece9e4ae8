#!/usr/bin/env bash
# Ctrl-C ends a kolo-train run cleanly on every rank within a bounded time: each rank stops after
# its current step, shuts the engine down, prints that it was interrupted and exits 130, and rank 0
# writes the record with status=failed, error="interrupted". Checked for one process (SIGINT), 2
# ranks under kolo-run (which forwards SIGINT) and 2 ranks under mpirun (which turns SIGINT into
# SIGTERM for the ranks; its SIGKILL grace is raised from 1 s so that a step can finish).
# And a rank ends within a second of SIGTERM where no step can finish: waiting in the rendezvous
# for a rank that has not started, waiting for one killed at start-up, and (mpirun) blocked in an
# MPI collective whose peer is stopped; it says which phase it was in.
# Usage: train_signal.sh BIN_DIR. Exit 77 (skip) without kolo-train or oneDNN.
set -euo pipefail

bin=${1:?usage: train_signal.sh BIN_DIR}
train=$bin/kolo-train
[[ -x $train ]] || { echo "skip: $train not built"; exit 77; }
[[ $("$train" --help) == *onednn* ]] || { echo "skip: this build has no oneDNN backend"; exit 77; }

work=$(mktemp -d)
launched=
cleanup() {
  # Only what this script started: the launcher, its process group and its children (the ranks),
  # and any rank of its jobs (by their --json path), stopped ones included.
  if [[ -n $launched ]] && kill -0 "$launched" 2>/dev/null; then
    pkill -KILL -P "$launched" 2>/dev/null || true
    kill -KILL -- "-$launched" 2>/dev/null || true
  fi
  local pid
  for pid in $(pgrep -f -- "--json $work/run.json" || true); do
    kill -CONT "$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [[ -f $work/out ]] && cat "$work/out"; exit 1; }

args=(--model tiny-cnn --batch-size 2 --num-classes 10 --num-warmup-batches 0
      --num-batches 100000000 --display-every 50 --compute onednn --peer-timeout-s 20)

# Starts "$@" in a session of its own, waits (bounded) for the first step line, sends it SIGINT
# and waits (bounded: 90 s) for it to exit. Sets `rc`.
interrupt() {
  rm -f "$work/out" "$work/run.json"
  setsid "$@" >"$work/out" 2>&1 &
  launched=$!
  local waited=0
  until grep -Eq $'^[0-9]+\timages/sec' "$work/out" 2>/dev/null; do
    kill -0 "$launched" 2>/dev/null || fail "exited before training: $*"
    ((waited++ < 600)) || fail "no step line within 120 s: $*"
    sleep 0.2
  done
  kill -INT "$launched"
  SECONDS=0
  waited=0
  while kill -0 "$launched" 2>/dev/null; do
    ((waited++ < 450)) || fail "still running 90 s after SIGINT: $*"
    sleep 0.2
  done
  set +e
  wait "$launched"
  rc=$?
  set -e
  launched=
}

check_record() {
  python3 - "$work/run.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["status"] == "failed" and r["error"] == "interrupted", r
assert "results" not in r, r
assert r["settings"]["model"] == "tiny-cnn", r
EOF
}

# One process.
interrupt "$train" "${args[@]}" --json "$work/run.json"
[[ $rc == 130 ]] || fail "single process exited $rc after SIGINT, expected 130"
grep -q 'rank 0: interrupted' "$work/out" || fail "no interrupted message"
check_record
echo "single process: ok"

# Two ranks under kolo-run, Ctrl-C to the launcher.
if [[ -x $bin/kolo-run ]]; then
  interrupt "$bin/kolo-run" -np 2 "$train" "${args[@]}" --json "$work/run.json"
  [[ $rc == 130 ]] || fail "kolo-run exited $rc after SIGINT, expected 130"
  for r in 0 1; do grep -q "rank $r: interrupted" "$work/out" || fail "rank $r not interrupted"; done
  check_record
  echo "kolo-run, 2 ranks: ok"
fi

# Two ranks under mpirun, Ctrl-C to mpirun (each rank runs in a process group of its own, so a
# terminal's Ctrl-C reaches only mpirun, which sends the ranks SIGTERM). A background job of a
# script starts with SIGINT ignored, which mpirun would keep: the default is restored first.
config=$bin/../generated/kolo/config.h
if command -v mpirun >/dev/null && grep -q "KOLO_HAVE_MPI 1" "$config" 2>/dev/null; then
  interrupt python3 -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])' mpirun --oversubscribe --allow-run-as-root \
    --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
    --mca odls_base_sigkill_timeout 10 -np 2 "$train" "${args[@]}" --json "$work/run.json"
  [[ $rc != 0 ]] || fail "mpirun exited 0 after SIGINT"
  for r in 0 1; do grep -q "rank $r: interrupted" "$work/out" || fail "rank $r not interrupted"; done
  check_record
  echo "mpirun, 2 ranks: ok (mpirun exited $rc after ${SECONDS} s)"
else
  echo "note: mpirun part not run (no mpirun, or no MPI in this build)"
fi

# SIGTERM to one rank where it cannot finish a step: it must be gone within 1 s (polled every
# 50 ms) and name the phase. `term_rank VAR=VALUE WHAT` signals the rank of the job in $work/out.
term_rank() {
  local pid= waited=0
  until pid=$(job_rank_pid "--json $work/run.json" "$1") && [[ -n $pid ]]; do
    ((waited++ < 200)) || fail "$2: rank $1 did not start within 20 s"
    sleep 0.1
  done
  # Only the kolo-train process itself (kolo-run starts it through sh -c in the first cases).
  while [[ $(cat "/proc/$pid/comm" 2>/dev/null) != kolo-train ]]; do
    ((waited++ < 400)) || fail "$2: rank $1 never became kolo-train"
    sleep 0.05
  done
  sleep "${3:-0.5}"
  kill -TERM "$pid"
  local start=$EPOCHREALTIME
  waited=0
  while kill -0 "$pid" 2>/dev/null; do
    ((waited++ < 40)) || fail "$2: rank still running 2 s after SIGTERM"
    sleep 0.05
  done
  local took
  took=$(python3 -c "print(f'{$EPOCHREALTIME - $start:.2f}')")
  python3 -c "import sys; sys.exit(0 if $took <= 1.0 else 1)" || fail "$2: ended $took s after SIGTERM (> 1 s)"
  echo "$2: ended $took s after SIGTERM"
}
# shellcheck source=tests/scripts/lib/job.bash
source "$(dirname "$0")/lib/job.bash"
if [[ -x $bin/kolo-run ]]; then
  # Rank 0 in the rendezvous, rank 1 not started yet.
  job_start "$bin/kolo-run" -np 2 --timeout-s 60 -- sh -c \
    '[ "$KOLO_RANK" = 1 ] && sleep 20; exec "$@"' sh "$train" "${args[@]}" --json "$work/run.json"
  term_rank KOLO_RANK=0 "rendezvous, a rank missing"
  grep -q "rank 0: SIGTERM during start-up (rendezvous" "$work/out" || fail "rendezvous: phase not named"
  kill -TERM "$launched" 2>/dev/null || true
  job_wait_bounded 15 || fail "kolo-run still running 15 s after SIGTERM"
  # Rank 1 killed at start-up: rank 0 still waits for it (its connection is not yet made).
  job_start "$bin/kolo-run" -np 2 --timeout-s 60 -- sh -c \
    '[ "$KOLO_RANK" = 1 ] && { sleep 0.3; kill -KILL $$; }; exec "$@"' sh "$train" "${args[@]}" \
    --json "$work/run.json"
  term_rank KOLO_RANK=0 "start-up, a rank killed" 0.8
  job_wait_bounded 15 || fail "kolo-run still running 15 s after its rank ended"
fi
if command -v mpirun >/dev/null && grep -q "KOLO_HAVE_MPI 1" "$config" 2>/dev/null; then
  # Rank 0 blocked inside MPI_Allreduce (the mpi backend) while rank 1 is stopped.
  job_start mpirun --oversubscribe --allow-run-as-root --mca btl self,tcp --mca btl_tcp_if_include lo \
    --mca oob_tcp_if_include lo -np 2 "$train" "${args[@]}" --backend mpi --json "$work/run.json"
  job_wait_step "mpi backend"
  stopped=$(job_rank_pid "--json $work/run.json" OMPI_COMM_WORLD_RANK=1)
  [[ -n $stopped ]] || fail "mpi backend: rank 1 not found"
  kill -STOP "$stopped"
  term_rank OMPI_COMM_WORLD_RANK=0 "inside an MPI collective, its peer stopped"
  grep -q "rank 0: SIGTERM during step" "$work/out" || fail "mpi backend: phase not named"
  kill -KILL "$stopped" 2>/dev/null || true
  job_wait_bounded 30 || { job_cleanup "--json $work/run.json"; fail "mpirun still running 30 s later"; }
fi
echo "PASS"
