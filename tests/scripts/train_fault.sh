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
# shellcheck source=tests/scripts/lib/job.bash
source "$(dirname "$0")/lib/job.bash"
trap 'job_cleanup "--json $work/run.json"; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; [[ -f $work/out ]] && cat "$work/out"; exit 1; }

for round in 1 2 3; do
  rm -f "$work/run.json"
  job_start "$run" -np 3 --timeout-s 120 "$train" --model resnet101 --batch-size 64 \
    --compute replay --profile "$root/models/profiles/resnet101-h100-b64.json" \
    --num-warmup-batches 1 --num-batches 100000 --display-every 5 --peer-timeout-s 20 \
    --json "$work/run.json"
  job_wait_step "round $round"
  victim=$(job_rank_pid "--json $work/run.json" KOLO_RANK=2)  # kolo-run sets each rank's KOLO_RANK
  [[ -n $victim ]] || fail "round $round: rank 2 not found among kolo-run's ranks"
  kill -KILL "$victim"
  job_wait_exit 60 "round $round"
  [[ $rc != 0 ]] || fail "round $round: kolo-run exited 0 after a rank was killed"
  python3 - "$work/run.json" "$round" <<'PY' || fail "round $round: record"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["status"] == "failed", r
assert r["error"] != "interrupted" and "rank 2" in r["error"], r["error"]
print(f"round {sys.argv[2]}: rank 0 recorded: {r['error'][:160]}")
PY
  # Neither survivor calls itself interrupted: each reports the loss it saw.
  if grep -Eq "interrupted(; stopped after step| during start-up)" "$work/out"; then
    fail "round $round: a survivor reported the launcher's signal instead of the lost rank"
  fi
  leftovers=$(pgrep -f -- "--json $work/run.json" || true)
  [[ -z $leftovers ]] || fail "round $round: processes left: $leftovers"
done
echo "PASS"
