#!/usr/bin/env bash
# kolo-train with parameter servers against ring training of the same tiny models: with the same
# seed, data and SGD, every step's loss must match (the servers' SGD is the trainer's), for 1 and
# 2 servers, both placements and explicit server ranks; the run record counts workers as ranks and
# servers apart; bad settings fail before any work. (Faults: tests/engine/ps_fault_test.cc.)
# Usage: ps_train.sh BIN_DIR   (exit 77 = skipped)
set -u

BIN=${1:?usage: ps_train.sh BIN_DIR}
TRAIN="$BIN/kolo-train"
RUN="$BIN/kolo-run"
for tool in "$TRAIN" "$RUN"; do
  if [[ ! -x "$tool" ]]; then
    echo "SKIP: $tool not built"
    exit 77
  fi
done
if ! command -v python3 >/dev/null; then
  echo "SKIP: python3 is not installed"
  exit 77
fi
# Losses must be real: oneDNN compute (replay has none). The replay side: train_replay.sh.
if ! "$TRAIN" --help | grep -q 'onednn'; then
  echo "SKIP: this build has no oneDNN backend (losses need real compute)"
  exit 77
fi

FAILURES=0
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() {
  echo "FAIL: $*"
  FAILURES=$((FAILURES + 1))
}

STEPS=8
COMMON=(--compute onednn --batch-size 8 --num-warmup-batches 0 --num-batches "$STEPS"
  --display-every 1 --seed 7)

# train NAME NP MODEL [flags...]: runs kolo-train, keeps the step losses in $TMP/NAME.loss.
train() {
  local name=$1 np=$2 model=$3
  shift 3
  timeout 300 "$RUN" -np "$np" "$TRAIN" --model "$model" "${COMMON[@]}" --json "$TMP/$name.json" \
    "$@" >"$TMP/$name.out" 2>&1
  local rc=$?
  if [[ $rc != 0 ]]; then
    fail "$name: exit code $rc: $(tail -20 "$TMP/$name.out")"
    return 1
  fi
  # Step lines: "<step>\timages/sec: ...\t<loss>\t...".
  awk -F'\t' '$1 ~ /^[0-9]+$/ && $2 ~ /images\/sec/ { print $1, $3 }' "$TMP/$name.out" \
    >"$TMP/$name.loss"
  [[ $(wc -l <"$TMP/$name.loss") == "$STEPS" ]] || fail "$name: expected $STEPS step lines"
}

# same_losses A B: every step's loss agrees to float32 tolerance.
same_losses() {
  python3 - "$TMP/$1.loss" "$TMP/$2.loss" <<'PY' || fail "$1 vs $2: losses differ"
import sys
a = [l.split() for l in open(sys.argv[1])]
b = [l.split() for l in open(sys.argv[2])]
ok = len(a) == len(b) and len(a) > 0
for x, y in zip(a, b):
    if x[0] != y[0] or abs(float(x[1]) - float(y[1])) > 2e-3 * max(1.0, abs(float(x[1]))):
        ok = False
        print(f"step {x[0]}: {x[1]} vs step {y[0]}: {y[1]}")
# Training must be doing something, or equal losses prove nothing.
if len(a) > 1 and abs(float(a[0][1]) - float(a[-1][1])) < 1e-3:
    ok = False
    print("the loss did not change")
sys.exit(0 if ok else 1)
PY
}

# record_ok NAME RANKS SERVERS PLACEMENT: the run record says what ran.
record_ok() {
  python3 - "$TMP/$1.json" "$2" "$3" "$4" <<'PY' || fail "$1: run record"
import json, sys
r = json.load(open(sys.argv[1]))
s = r["settings"]
want = (int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
got = (s["ranks"], s["ps_servers"], s["ps_placement"])
# Rank 0 (a worker) pushed and pulled every step: its byte counters are in the record.
e = r["results"]["engine_stats"]
ok = r["status"] == "ok" and s["backend"] == "ps" and got == want
ok = ok and e["ps_bytes_sent"] > 0 and e["ps_bytes_received"] > 0 and e["ps_updates"] > 0
if not ok:
    print(f"status {r['status']}, backend {s['backend']}, (ranks, ps_servers, placement) {got}, "
          f"expected {want}; engine_stats {e}")
sys.exit(0 if ok else 1)
PY
}

for model in tiny-mlp tiny-cnn; do
  train "$model.ring" 2 "$model" --backend ring || continue
  train "$model.ps1" 3 "$model" --backend ps --ps-servers 1 &&
    same_losses "$model.ring" "$model.ps1" && record_ok "$model.ps1" 2 1 greedy
  train "$model.ps2split" 4 "$model" --backend ps --ps-servers 2 --ps-placement split &&
    same_losses "$model.ring" "$model.ps2split" && record_ok "$model.ps2split" 2 2 split
  train "$model.ps2greedy" 4 "$model" --backend ps --ps-server-ranks 0,3 &&
    same_losses "$model.ring" "$model.ps2greedy"
done

# Bad settings fail before any work, with the value and what is allowed.
out=$(timeout 60 "$RUN" -np 2 "$TRAIN" --model tiny-mlp "${COMMON[@]}" --backend ps \
  --ps-servers 2 2>&1)
[[ $? != 0 ]] || fail "--ps-servers 2 at 2 ranks: exit code 0"
grep -qF "allowed are 1 to size - 1 = 1 servers" <<<"$out" || fail "--ps-servers 2 at 2 ranks: $out"

if [[ $FAILURES -gt 0 ]]; then
  echo "$FAILURES check(s) failed"
  exit 1
fi
echo "ps_train: all checks passed"
