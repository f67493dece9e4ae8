#!/usr/bin/env bash
# Ctrl-C ends a kolo-train run cleanly on every rank within a bounded time: each rank stops after
# its current step, shuts the engine down, prints that it was interrupted and exits 130, and rank 0
# writes the record with status=failed, error="interrupted". Checked for one process (SIGINT), 2
# ranks under kolo-run (which forwards SIGINT) and 2 ranks under mpirun (which turns SIGINT into
# SIGTERM for the ranks; its SIGKILL grace is raised from 1 s so that a step can finish).
# Usage: train_signal.sh BIN_DIR. Exit 77 (skip) without kolo-train or oneDNN.
set -euo pipefail

bin=${1:?usage: train_signal.sh BIN_DIR}
train=$bin/kolo-train
[[ -x $train ]] || { echo "skip: $train not built"; exit 77; }
[[ $("$train" --help) == *onednn* ]] || { echo "skip: this build has no oneDNN backend"; exit 77; }

work=$(mktemp -d)
launched=
cleanup() {
  # Only what this script started: the launcher, its process group and its children (the ranks).
  if [[ -n $launched ]] && kill -0 "$launched" 2>/dev/null; then
    pkill -KILL -P "$launched" 2>/dev/null || true
    kill -KILL -- "-$launched" 2>/dev/null || true
  fi
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
echo "PASS"
