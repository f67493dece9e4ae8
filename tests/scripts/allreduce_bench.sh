#!/usr/bin/env bash
# Smoke test of kolo-allreduce-bench: every backend over a tiny size range under kolo-run and
# mpirun (2 ranks), the ring and link rows over two transports in one run, MPI over shared memory,
# a ResNet-101 step, flag errors, and the JSON report.
# $1: the build's bin directory. Exit 77 (skip) if mpirun or the build's MPI is missing, after the
# kolo-run part.
set -u -o pipefail

BIN=${1:?usage: allreduce_bench.sh BUILD_BIN_DIR}
BENCH=$BIN/kolo-allreduce-bench
KOLO_RUN=$BIN/kolo-run
[[ -x $BENCH ]] || { echo "FAIL: $BENCH not built"; exit 1; }
[[ -x $KOLO_RUN ]] || { echo "FAIL: $KOLO_RUN not built"; exit 1; }
command -v python3 >/dev/null || { echo "SKIP: python3 is needed to read the JSON"; exit 77; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
MPIRUN_ARGS=(--oversubscribe --allow-run-as-root --mca btl self,tcp --mca btl_tcp_if_include lo
             --mca oob_tcp_if_include lo -x MALLOC_MMAP_THRESHOLD_=4294967295)
TINY=(-b 8 -e 64K -f 16 -n 3 -w 1)
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# run NAME CMD...: runs with a time limit, keeps the output in $WORK/NAME.out, returns the status.
run() {
  local name=$1; shift
  timeout 300 "$@" >"$WORK/$name.out" 2>&1
  local rc=$?
  echo "--- $name (exit $rc): $*"
  tail -n 40 "$WORK/$name.out"
  return $rc
}

# check_sweep NAME JSON ROW...: every expected row label at every size, nothing wrong, ratios.
check_sweep() {
  local name=$1 json=$2; shift 2
  python3 - "$json" "$@" <<'EOF' || fail "$name: JSON check"
import json, sys
doc = json.load(open(sys.argv[1]))
want = sys.argv[2:]
rows = doc["rows"]
sizes = sorted({r["bytes"] for r in rows})
assert sizes == [8, 128, 2048, 32768], f"sizes {sizes}"
assert doc["ranks"] == 2, doc["ranks"]
for label in want:
    got = [r for r in rows if r["backend"] == label]
    assert len(got) == len(sizes), f"{label}: {len(got)} rows for {len(sizes)} sizes"
    for r in got:
        assert r["time"]["min_us"] <= r["time"]["median_us"] <= r["time"]["max_us"], r
        assert r["time"]["median_us"] > 0 and r["busbw_gbs"] > 0, r
        if label != "link":
            assert r["checked"] and r["wrong"] == 0, f"{label} at {r['bytes']}: {r['wrong']} wrong"
if "link" in want and "ring" in want:
    assert all(x["ring_link"] is not None for x in doc["ratios"]), doc["ratios"]
print(f"ok: {len(rows)} rows, labels {want}")
EOF
}

# check_table NAME ROW...: the printed table has each row label and a zero #wrong on every line.
check_table() {
  local name=$1; shift
  local out=$WORK/$name.out
  grep -q "busbw(GB/s)" "$out" || fail "$name: no table header"
  for label in "$@"; do
    grep -Eq "^ +[0-9]+ +[0-9]+ +float32 +$label\*? " "$out" || fail "$name: no row for $label"
  done
  if awk '/^ +[0-9]+ +[0-9]+ +[a-z0-9]+ +[a-z-]+\*? /{ if ($8 != "0" && $8 != "n/a") bad=1 } END{ exit !bad }' "$out"; then
    fail "$name: a row has wrong elements"
  fi
}

check_steps() {
  local name=$1 json=$2 rows=$3
  python3 - "$json" "$rows" <<'EOF' || fail "$name: step JSON check"
import json, sys
doc = json.load(open(sys.argv[1]))
step = doc["step"]
assert step["model"] == "resnet101" and step["tensors"] == 314, step
assert step["parameters"] == 44549160, step["parameters"]
assert len(step["rows"]) == int(sys.argv[2]), len(step["rows"])
for r in step["rows"]:
    assert r["wrong"] == 0, r
    assert r["step"]["median_us"] > 0 and r["single"]["median_us"] > 0 and r["ratio"] > 0, r
    # Warmed up: every timed step agrees through the cache alone, and the single allreduce that
    # follows each step (a 315th name) is not counted in the step's statistics.
    assert r["per_step"]["cache_hits"] == 314 and r["per_step"]["negotiations"] == 0, r
    if not r["fusion"]:
        assert r["per_step"]["collectives"] == 314, r
print("ok:", [(r["backend"], r["fusion"], round(r["ratio"], 3)) for r in step["rows"]])
EOF
}

# Which optional peers this build has: the build's generated config header says so, so a real
# Gloo failure still fails the runs below instead of reading as "not built".
CONFIG="$BIN/../generated/kolo/config.h"
[[ -f $CONFIG ]] || { echo "FAIL: $CONFIG not found (is $BIN a build's bin directory?)"; exit 1; }
HAVE_GLOO=0
grep -q "KOLO_HAVE_GLOO 1" "$CONFIG" && HAVE_GLOO=1
HAVE_MPI=0
grep -q "KOLO_HAVE_MPI 1" "$CONFIG" && HAVE_MPI=1
echo "gloo peer built: $HAVE_GLOO, MPI built: $HAVE_MPI"

# --- Errors: clear message, non-zero status, no hang.
expect_error() {
  local name=$1 pattern=$2; shift 2
  run "$name" "$@"
  local rc=$?
  [[ $rc -ne 0 && $rc -ne 124 ]] || fail "$name: exit $rc, expected a configuration error"
  grep -q -- "$pattern" "$WORK/$name.out" || fail "$name: message lacks '$pattern'"
}
expect_error bad_flag "bogus" "$BENCH" --bogus
expect_error bad_backend \
  "allowed are a comma list of ring, ring-hier, mpi, mpi-direct, gloo, link, nccl, nccl-direct" \
  "$BENCH" --backend ring,nvlink
# Device buffers: the flag's values, the rows that can and cannot reduce them, and (on a host
# without a GPU or a build without CUDA) the refusal naming why.
expect_error bad_device "'gpu' is unknown: allowed are host, cuda" "$BENCH" --device gpu
expect_error nccl_on_host "pass --device cuda" "$BENCH" --backend ring,nccl
expect_error gloo_on_device "with --device cuda allowed are ring, ring-hier, nccl, nccl-direct" \
  "$BENCH" --device cuda --backend ring,gloo
expect_error tensors_on_device "the step mode measures host gradients" \
  "$BENCH" --device cuda --tensors resnet101
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  expect_error cuda_without_gpu "--device cuda: " "$BENCH" --device cuda -e 64
  grep -q "allowed here: --device host" "$WORK/cuda_without_gpu.out" ||
    fail "cuda_without_gpu: the refusal does not say what is allowed"
fi
expect_error bad_dtype "float8" "$BENCH" --dtype float8
expect_error bad_size "maxbytes" "$BENCH" -b 1M -e 1K
expect_error odd_size "is not a whole number of float32 elements" "$BENCH" -b 3 -e 64
expect_error bad_tensors "allowed are resnet101" "$BENCH" --tensors alexnet
expect_error zero_threshold "fusion-threshold-mb=0" "$BENCH" --tensors resnet101 --fusion-threshold-mb 0
expect_error bad_transport "transport 'udp' is unknown; allowed: auto, shm, tcp" \
  "$BENCH" --transport shm,udp
expect_error empty_transport "has an empty name" "$BENCH" --transport shm,,tcp
expect_error steps_transports "names several transports" "$BENCH" --tensors resnet101 --transport shm,tcp
# With MPI built, the MPI rows need mpirun's launch; without it, they are refused as not built.
if [[ $HAVE_MPI == 1 ]]; then
  expect_error mpi_under_kolo_run "needs a launch by mpirun" \
    "$KOLO_RUN" -np 2 --timeout-s 60 "$BENCH" --backend mpi-direct -e 64
else
  expect_error mpi_not_built "this build has no MPI" \
    "$KOLO_RUN" -np 2 --timeout-s 60 "$BENCH" --backend mpi-direct -e 64
fi

# --- One rank, no launcher.
ONE_BACKENDS=ring,link
[[ $HAVE_GLOO == 1 ]] && ONE_BACKENDS+=,gloo
if run one_rank "$BENCH" -b 8 -e 4K -f 8 -n 2 -w 1 --backend "$ONE_BACKENDS"; then
  check_table one_rank ring link
  grep -q "check: every result matches" "$WORK/one_rank.out" || fail "one_rank: no check verdict"
else
  fail "one_rank: non-zero exit"
fi

# --- kolo-run, 2 ranks: every backend it can run.
KR_BACKENDS=ring,link
KR_ROWS=(ring link)
if [[ $HAVE_GLOO == 1 ]]; then KR_BACKENDS+=,gloo; KR_ROWS+=(gloo-ring-chunked gloo-allreduce); fi
if run kr_sweep "$KOLO_RUN" -np 2 --timeout-s 280 "$BENCH" "${TINY[@]}" --backend "$KR_BACKENDS" \
    --json "$WORK/kr_sweep.json"; then
  check_table kr_sweep "${KR_ROWS[@]}"
  check_sweep kr_sweep "$WORK/kr_sweep.json" "${KR_ROWS[@]}"
else
  fail "kr_sweep: non-zero exit"
fi
if run kr_half "$KOLO_RUN" -np 2 --timeout-s 280 "$BENCH" "${TINY[@]}" --backend "$KR_BACKENDS" \
    --dtype bfloat16 --op avg --json "$WORK/kr_half.json"; then
  check_sweep kr_half "$WORK/kr_half.json" "${KR_ROWS[@]}"
else
  fail "kr_half: non-zero exit"
fi
if run kr_int "$KOLO_RUN" -np 2 --timeout-s 280 "$BENCH" "${TINY[@]}" --backend "$KR_BACKENDS" \
    --dtype int32 --op avg --json "$WORK/kr_int.json"; then
  check_sweep kr_int "$WORK/kr_int.json" "${KR_ROWS[@]}"
else
  fail "kr_int: non-zero exit"
fi
# The ring and link rows over two transports in one run: a row of each per transport, and each
# ring row's ratio against its own transport's link.
if run kr_transports "$KOLO_RUN" -np 2 --timeout-s 280 "$BENCH" "${TINY[@]}" --backend ring,link \
    --transport shm,tcp --json "$WORK/kr_transports.json"; then
  check_table kr_transports ring-shm ring-tcp link-shm link-tcp
  python3 - "$WORK/kr_transports.json" <<'EOF' || fail "kr_transports: JSON check"
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["settings"]["transports"] == ["shm", "tcp"], doc["settings"]
for r in doc["rows"]:
    t = r["backend"].split("-")[1]
    assert r["transport"] == t and r["pairs"] == t, r
    assert r["backend"].startswith("link") or (r["checked"] and r["wrong"] == 0), r
assert {(x["ring"], x["transport"]) for x in doc["ratios"]} == {("ring-shm", "shm"), ("ring-tcp", "tcp")}
assert all(x["ring_link"] is not None for x in doc["ratios"]), doc["ratios"]
print("kr_transports: ok")
EOF
else
  fail "kr_transports: non-zero exit"
fi
if run kr_steps "$KOLO_RUN" -np 2 --timeout-s 280 "$BENCH" --tensors resnet101 --iters 2 -w 1 \
    --json "$WORK/kr_steps.json"; then
  grep -q "goal (ring)" "$WORK/kr_steps.out" || fail "kr_steps: no goal line"
  check_steps kr_steps "$WORK/kr_steps.json" 2
else
  fail "kr_steps: non-zero exit"
fi

# --- mpirun, 2 ranks: every backend.
if [[ $HAVE_MPI != 1 ]] || ! command -v mpirun >/dev/null; then
  [[ $failures -eq 0 ]] || { echo "FAILED: $failures check(s)"; exit 1; }
  if [[ $HAVE_MPI != 1 ]]; then
    echo "SKIP: this build has no MPI (the kolo-run part passed)"
  else
    echo "SKIP: mpirun not found (the kolo-run part passed)"
  fi
  exit 77
fi
MR_BACKENDS=ring,link,mpi-direct,mpi
MR_ROWS=(ring link mpi-direct mpi)
if [[ $HAVE_GLOO == 1 ]]; then MR_BACKENDS+=,gloo; MR_ROWS+=(gloo-ring-chunked gloo-allreduce); fi
if run mr_sweep mpirun "${MPIRUN_ARGS[@]}" -np 2 "$BENCH" "${TINY[@]}" --backend "$MR_BACKENDS" \
    --json "$WORK/mr_sweep.json"; then
  check_table mr_sweep "${MR_ROWS[@]}"
  check_sweep mr_sweep "$WORK/mr_sweep.json" "${MR_ROWS[@]}"
  grep -q "ring/mpi-direct" "$WORK/mr_sweep.out" || fail "mr_sweep: no ratio table"
else
  fail "mr_sweep: non-zero exit"
fi
if run mr_int mpirun "${MPIRUN_ARGS[@]}" -np 2 "$BENCH" "${TINY[@]}" --backend ring,mpi-direct \
    --dtype uint8 --json "$WORK/mr_int.json"; then
  check_sweep mr_int "$WORK/mr_int.json" ring mpi-direct
else
  fail "mr_int: non-zero exit"
fi
if run mr_steps mpirun "${MPIRUN_ARGS[@]}" -np 2 "$BENCH" --tensors resnet101 --iters 2 -w 1 \
    --backend ring,mpi --json "$WORK/mr_steps.json"; then
  check_steps mr_steps "$WORK/mr_steps.json" 4
else
  fail "mr_steps: non-zero exit"
fi
expect_error mr_bad_flag "allowed are sum, avg" mpirun "${MPIRUN_ARGS[@]}" -np 2 "$BENCH" --op max
# Open MPI over shared memory (vader) against kolo's ring over shared memory and TCP: the record
# says which BTLs MPI was given.
SHM_MPIRUN_ARGS=(--oversubscribe --allow-run-as-root --mca btl self,vader --mca oob_tcp_if_include lo
                 -x MALLOC_MMAP_THRESHOLD_=4294967295)
if run mr_shm mpirun "${SHM_MPIRUN_ARGS[@]}" -np 2 "$BENCH" "${TINY[@]}" --backend ring,mpi-direct \
    --transport shm,tcp --json "$WORK/mr_shm.json"; then
  check_sweep mr_shm "$WORK/mr_shm.json" ring-shm ring-tcp mpi-direct
  grep -q "btl self,vader" "$WORK/mr_shm.out" || fail "mr_shm: the header does not name the BTLs"
  python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))["settings"]; assert s["mpi_btl"] == "self,vader", s' \
    "$WORK/mr_shm.json" || fail "mr_shm: mpi_btl"
else
  fail "mr_shm: non-zero exit"
fi

if [[ $failures -ne 0 ]]; then
  echo "FAILED: $failures check(s)"
  exit 1
fi
echo "PASSED"
