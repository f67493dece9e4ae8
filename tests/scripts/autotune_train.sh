#!/usr/bin/env bash
# kolo-train --autotune under kolo-run, 2 ranks, the tiny CNN on oneDNN: the coordinate search
# runs its 8 trials (the start, 3 more fusion thresholds, 3 more cycle times, the other ring
# algorithm; a ninth, hierarchical allreduce, where 4 ranks stand on 2 host names) between the
# warm-up and the timed steps; the run record lists them with the choice,
# which is the settings the record says the timed steps ran and the last kept trial's; the CSV
# log has the same rows. Refusals: --autotune with no allreduce engine to tune (backend none, as
# parameter servers), --autotune-log without --autotune (exit 2).
# Usage: autotune_train.sh BIN_DIR   (exit 77 = skipped)
set -euo pipefail

bin=${1:?usage: autotune_train.sh BIN_DIR}
train=$bin/kolo-train
run=$bin/kolo-run
for tool in "$train" "$run"; do
  [[ -x $tool ]] || { echo "SKIP: $tool not built"; exit 77; }
done
command -v python3 >/dev/null || { echo "SKIP: python3 is needed to read the run records"; exit 77; }
[[ $("$train" --help) == *onednn* ]] || { echo "SKIP: this build has no oneDNN backend"; exit 77; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

timeout 300 "$run" -np 2 --timeout-s 280 "$train" --model tiny-cnn --compute onednn --batch-size 8 \
  --num-warmup-batches 1 --num-batches 2 --autotune --autotune-trial-steps 2 \
  --autotune-log "$work/trials.csv" --json "$work/run.json" --peer-timeout-s 60 \
  >"$work/out" 2>&1 || { cat "$work/out"; fail "the autotune run failed"; }
cat "$work/out"
grep -q '^autotune: 8 trials; timed steps run fusion' "$work/out" || fail "no autotune summary line"

python3 - "$work/run.json" "$work/trials.csv" <<'PY'
import csv, json, sys
r = json.load(open(sys.argv[1]))
assert r["status"] == "ok", r
s, a = r["settings"], r["autotune"]
assert s["autotune"] is True, s
trials = a["trials"]
assert len(trials) == 8, trials
fusion = sorted({t["fusion_threshold_mb"] for t in trials})
assert fusion == [4, 16, 64, 128], fusion
assert {t["cycle_time_ms"] for t in trials} == {0.5, 1, 2.5, 5}, trials
assert {t["allreduce_algorithm"] for t in trials} == {"auto", "ring"}, trials
assert all(t["images_per_sec"] > 0 for t in trials), trials
kept = [t for t in trials if t["kept"]]
assert trials[0]["kept"] and kept, trials
last = kept[-1]
choice = a["choice"]
for k in ("fusion_threshold_mb", "cycle_time_ms", "allreduce_algorithm"):
    assert choice[k] == last[k] == s[k], (k, choice, last, s)
# Kept trials are faster than every trial before them.
best = 0
for t in trials:
    if t["kept"] and t is not trials[0]:
        assert t["images_per_sec"] > best, trials
    if t["kept"]:
        best = t["images_per_sec"]
rows = list(csv.DictReader(open(sys.argv[2])))
assert len(rows) == 8, rows
assert [float(x["images_per_sec"]) for x in rows] == [round(t["images_per_sec"], 3) for t in trials], rows
assert r["results"]["total_images_per_sec"] > 0
print("OK: 8 trials, choice", choice)
PY

# Two host names, two ranks on each (KOLO_HOST_NAME): hierarchical allreduce is a knob too, the
# ninth trial, and the choice says whether the timed steps ran it.
hosted=(sh -c 'KOLO_HOST_NAME=h$((KOLO_RANK / $0)) exec "$@"')
timeout 300 "$run" -np 4 --timeout-s 280 "${hosted[@]}" 2 "$train" --model tiny-cnn --compute onednn \
  --batch-size 8 --num-warmup-batches 1 --num-batches 2 --autotune --autotune-trial-steps 2 \
  --autotune-log "$work/trials4.csv" --json "$work/run4.json" --peer-timeout-s 60 \
  >"$work/out4" 2>&1 || { cat "$work/out4"; fail "the 2-host autotune run failed"; }
grep -q '^autotune: 9 trials; timed steps run fusion' "$work/out4" || { cat "$work/out4"; fail "no 9-trial summary"; }
python3 - "$work/run4.json" "$work/trials4.csv" <<'PY'
import csv, json, sys
r = json.load(open(sys.argv[1]))
assert r["status"] == "ok", r
trials, choice, s = r["autotune"]["trials"], r["autotune"]["choice"], r["settings"]
assert len(trials) == 9, trials
assert [t["hierarchical_allreduce"] for t in trials] == [False] * 8 + [True], trials
assert trials[8]["allreduce_algorithm"] in ("auto", "ring"), trials[8]
last = [t for t in trials if t["kept"]][-1]
assert choice["hierarchical_allreduce"] == last["hierarchical_allreduce"] == s["hierarchical_allreduce"], (choice, last, s)
rows = list(csv.DictReader(open(sys.argv[2])))
assert [x["hierarchical_allreduce"] for x in rows] == ["0"] * 8 + ["1"], rows
print("OK: 9 trials across 2 hosts, choice", choice)
PY

set +e
"$train" --model tiny-cnn --compute onednn --num-batches 1 --autotune --backend none >"$work/bad1" 2>&1
rc1=$?
"$train" --model tiny-cnn --compute onednn --num-batches 1 --autotune-log "$work/x.csv" >"$work/bad2" 2>&1
rc2=$?
set -e
[[ $rc1 -eq 2 ]] && grep -q "backend 'none' has none" "$work/bad1" || { cat "$work/bad1"; fail "--autotune --backend none: exit $rc1"; }
[[ $rc2 -eq 2 ]] && grep -q "which is not given" "$work/bad2" || { cat "$work/bad2"; fail "--autotune-log alone: exit $rc2"; }
echo "PASS"
