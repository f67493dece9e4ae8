#!/usr/bin/env bash
# The first cause is kept: under kolo-run, SIGKILL one rank of a 3-rank replay run mid-training.
# The survivors see the lost connection, then kolo-run's stop signal; rank 0's record and the
# survivors' exit must carry the lost connection (naming rank 2), not "interrupted", and every
# process must be gone within the peer timeout. Repeated, since the loss and the launcher's signal
# race each other.
# Usage: train_fault.sh BIN_DIR   (exit 77 = skipped)
set -euo pipefail

bin=${1:?usage: train_fault.sh BIN_DIR}
train=$bin/kolo-train
run=$bin/kolo-run
root=$(cd "$(dirname "$0")/../.." && pwd)
for tool in "$train" "$run"; do
  [[ -x $tool ]] || { echo "SKIP: $tool not built"; exit 77; }
done
command -v python3 >/dev/null || { echo "SKIP: python3 is needed to read the run record"; exit 77; }

work=$(mktemp -d)
launched=
cleanup() {
  if [[ -n $launched ]] && kill -0 "$launched" 2>/dev/null; then
    pkill -KILL -P "$launched" 2>/dev/null || true
    kill -KILL -- "-$launched" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [[ -f $work/out ]] && cat "$work/out"; exit 1; }

# The rank-N kolo-train among the launcher's children (kolo-run gives each its KOLO_RANK).
rank_pid() {
  local pid
  for pid in $(pgrep -P "$launched"); do
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "KOLO_RANK=$1" && { echo "$pid"; return; }
  done
}

for round in 1 2 3; do
  rm -f "$work/out" "$work/run.json"
  setsid "$run" -np 3 --timeout-s 120 "$train" --model resnet101 --batch-size 64 --compute replay \
    --profile "$root/models/profiles/resnet101-h100-b64.json" --num-warmup-batches 1 \
    --num-batches 100000 --display-every 5 --peer-timeout-s 20 --json "$work/run.json" \
    >"$work/out" 2>&1 &
  launched=$!
  waited=0
  until grep -Eq $'^[0-9]+\timages/sec' "$work/out" 2>/dev/null; do
    kill -0 "$launched" 2>/dev/null || fail "round $round: exited before training"
    ((waited++ < 600)) || fail "round $round: no step line within 120 s"
    sleep 0.2
  done
  victim=$(rank_pid 2)
  [[ -n $victim ]] || fail "round $round: rank 2 not found among kolo-run's children"
  kill -KILL "$victim"
  SECONDS=0
  while kill -0 "$launched" 2>/dev/null; do
    ((SECONDS < 60)) || fail "round $round: still running 60 s after rank 2 was killed"
    sleep 0.2
  done
  set +e
  wait "$launched"
  rc=$?
  set -e
  launched=
  [[ $rc != 0 ]] || fail "round $round: kolo-run exited 0 after a rank was killed"
  python3 - "$work/run.json" "$round" <<'PY' || fail "round $round: record"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["status"] == "failed", r
assert r["error"] != "interrupted" and "rank 2" in r["error"], r["error"]
print(f"round {sys.argv[2]}: rank 0 recorded: {r['error'][:160]}")
PY
  # Neither survivor calls itself interrupted: each reports the loss it saw.
  if grep -q "interrupted; stopped after the current step" "$work/out"; then
    fail "round $round: a survivor reported the launcher's signal instead of the lost rank"
  fi
  leftovers=$(pgrep -f -- "--json $work/run.json" || true)
  [[ -z $leftovers ]] || fail "round $round: processes left: $leftovers"
done
echo "PASS"
