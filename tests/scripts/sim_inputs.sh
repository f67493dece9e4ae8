#!/usr/bin/env bash
# kolo-sim reads every file it is named through the bounded reader (engine/common/file.h): a FIFO
# (with or without a writer), /dev/zero, a directory or a file over the limit given as
# --calibration, --base, a bench document, --incast or --jitter ends at once with exit 2
# (kolo-sim's exit for bad input) and a line naming the path, what it is and what is allowed; a
# --profile, read while predicting, ends with exit 1 as any failed prediction does. Before, /dev/zero
# grew to gigabytes and a FIFO blocked forever. Each run is bounded by `timeout 10` and by a 1 GiB
# address-space limit, so a regression fails here instead of hanging or exhausting the machine.
# Usage: sim_inputs.sh BIN_DIR   (exit 77 = skipped)
set -euo pipefail

bin=${1:?usage: sim_inputs.sh BIN_DIR}
sim=$bin/kolo-sim
root=$(cd "$(dirname "$0")/../.." && pwd)
profile=$root/models/profiles/resnet101-h100-b64.json
bench=$root/sim/calibrations/bench
[[ -x $sim ]] || { echo "SKIP: kolo-sim not built"; exit 77; }
command -v mkfifo >/dev/null && command -v timeout >/dev/null && command -v truncate >/dev/null ||
  { echo "SKIP: mkfifo, timeout and truncate are needed"; exit 77; }

work=$(mktemp -d)
writer=
cleanup() {
  [[ -n $writer ]] && kill "$writer" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

mkfifo "$work/fifo"
mkdir "$work/dir"
# 65 MiB, one more than kolo-sim reads of any file; sparse, so it costs no disk.
truncate -s 65M "$work/huge.json"
good_bench=$(ls "$bench"/*.json | head -1)
[[ -f $good_bench ]] || fail "no bench document under $bench"

# expect_refused NAME PATH WHAT -- ARGS...: kolo-sim ARGS exits $want (2 unless set) within 5 s
# and its error names PATH as WHAT.
expect_refused() {
  local name=$1 path=$2 what=$3
  shift 4
  local start rc=0 took want=${want:-2}
  start=$(date +%s%N)
  (ulimit -v 1048576; timeout 10 "$sim" "$@") >"$work/out" 2>&1 </dev/null || rc=$?
  took=$(( ($(date +%s%N) - start) / 1000000 ))
  ((rc == want)) || { cat "$work/out"; fail "$name: exit $rc, want $want (124: it hung; 134: it ran out of memory)"; }
  ((took < 5000)) || fail "$name: took $took ms to refuse $path"
  grep -qF "'$path' is $what" "$work/out" || { cat "$work/out"; fail "$name: the error does not name '$path' as $what"; }
  if [[ $what != [0-9]* ]]; then
    grep -qF "kolo reads only regular files" "$work/out" || { cat "$work/out"; fail "$name: the error does not say what is allowed"; }
  else
    grep -qF "more than the 67108864 allowed" "$work/out" || { cat "$work/out"; fail "$name: the error does not name the limit"; }
  fi
  echo "ok: $name ($took ms): $(head -1 "$work/out")"
}

predict=(predict --model resnet101 --profile "$profile" --ranks 2 --backend ring --link 1gbit)
expect_refused "predict --calibration /dev/zero" /dev/zero "a character device" -- \
  "${predict[@]}" --calibration /dev/zero
expect_refused "predict --calibration FIFO" "$work/fifo" "a FIFO" -- \
  "${predict[@]}" --calibration "$work/fifo"
expect_refused "predict --calibration DIR" "$work/dir" "a directory" -- \
  "${predict[@]}" --calibration "$work/dir"
expect_refused "predict --calibration HUGE" "$work/huge.json" "68157440 bytes" -- \
  "${predict[@]}" --calibration "$work/huge.json"
# The profile is read while predicting: a failed prediction, exit 1 (and a failed record for the
# sweep runner), as for any profile that cannot be used.
want=1 expect_refused "predict --profile FIFO" "$work/fifo" "a FIFO" -- \
  predict --model resnet101 --profile "$work/fifo" --ranks 2 --backend ring --link 1gbit
expect_refused "allreduce --calibration /dev/zero" /dev/zero "a character device" -- \
  allreduce --ranks 2 --calibration /dev/zero
expect_refused "calibrate BENCH=/dev/zero" /dev/zero "a character device" -- \
  calibrate --link 1gbit /dev/zero
expect_refused "calibrate --base FIFO" "$work/fifo" "a FIFO" -- \
  calibrate --link 1gbit --base "$work/fifo" "$good_bench"
expect_refused "calibrate --incast FIFO" "$work/fifo" "a FIFO" -- \
  calibrate --link 1gbit --incast "$work/fifo" "$good_bench"
expect_refused "calibrate --jitter /dev/zero" /dev/zero "a character device" -- \
  calibrate --link 1gbit --jitter /dev/zero "$good_bench"

# A FIFO whose writer never stops is refused without reading any of it.
yes >"$work/fifo" &
writer=$!
expect_refused "predict --calibration FIFO with a writer" "$work/fifo" "a FIFO" -- \
  "${predict[@]}" --calibration "$work/fifo"
kill "$writer" 2>/dev/null
wait "$writer" 2>/dev/null || true
writer=

# A good calibration is still read.
"$sim" "${predict[@]}" --calibration "$root/sim/calibrations/emulated-tbf.json" >"$work/out" 2>&1 ||
  { cat "$work/out"; fail "a good --calibration was not read"; }
echo "PASS"
