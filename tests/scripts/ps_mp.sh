#!/usr/bin/env bash
# The parameter-server backend with real processes under kolo-run and mpirun: after k steps every
# worker's weights equal the allreduce-average + SGD reference (kolo_ps_probe checks them) for
# 2-4 workers, 1-2 servers, both placements, default and explicit server ranks; bad settings fail
# on every rank with a clear error before any work.
# Usage: ps_mp.sh BIN_DIR   (exit 77 = skipped)
set -u

BIN=${1:?usage: ps_mp.sh BIN_DIR}
PROBE="$BIN/kolo_ps_probe"
RUN="$BIN/kolo-run"
for tool in "$PROBE" "$RUN"; do
  if [[ ! -x "$tool" ]]; then
    echo "SKIP: $tool not built"
    exit 77
  fi
done
MPIRUN_ARGS=(--oversubscribe --allow-run-as-root --mca btl self,tcp --mca btl_tcp_if_include lo
  --mca oob_tcp_if_include lo)
HAVE_MPIRUN=0
if command -v mpirun >/dev/null && grep -q "KOLO_HAVE_MPI 1" "$BIN/../generated/kolo/config.h" 2>/dev/null; then
  HAVE_MPIRUN=1
fi

FAILURES=0
fail() {
  echo "FAIL: $*"
  FAILURES=$((FAILURES + 1))
}

# check NAME NP OUTPUT: every rank reported ok.
check_ok() {
  local name=$1 np=$2 out=$3
  for ((r = 0; r < np; ++r)); do
    grep -q "rank $r: ok" <<<"$out" || fail "$name: rank $r did not report ok: $out"
  done
}

# run_job NAME NP ENV... : the probe at NP ranks under kolo-run and (if available) mpirun.
run_job() {
  local name=$1 np=$2
  shift 2
  local out rc
  out=$(env "$@" timeout 300 "$RUN" -np "$np" "$PROBE" 3 1 -1 0 0 2>&1)
  rc=$?
  [[ $rc == 0 ]] || fail "$name under kolo-run: exit code $rc: $out"
  check_ok "$name under kolo-run" "$np" "$out"
  if [[ $HAVE_MPIRUN == 1 ]]; then
    local -a xs=()
    for kv in "$@"; do xs+=(-x "$kv"); done
    out=$(timeout 300 mpirun "${MPIRUN_ARGS[@]}" "${xs[@]}" -np "$np" "$PROBE" 3 1 -1 0 0 2>&1)
    rc=$?
    [[ $rc == 0 ]] || fail "$name under mpirun: exit code $rc: $out"
    check_ok "$name under mpirun" "$np" "$out"
  fi
}

run_job w2_s1_greedy 3 KOLO_BACKEND=ps KOLO_PS_SERVERS=1
run_job w3_s1_split 4 KOLO_BACKEND=ps KOLO_PS_SERVERS=1 KOLO_PS_PLACEMENT=split
run_job w2_s2_split 4 KOLO_BACKEND=ps KOLO_PS_SERVERS=2 KOLO_PS_PLACEMENT=split
run_job w4_s2_greedy 6 KOLO_BACKEND=ps KOLO_PS_SERVERS=2
run_job w4_s2_explicit 6 KOLO_BACKEND=ps KOLO_PS_SERVER_RANKS=2,5 KOLO_PS_PLACEMENT=split

# Bad settings: every rank fails before any work, naming the value and what is allowed.
expect_error() {
  local name=$1 np=$2 want=$3
  shift 3
  local out rc
  out=$(env "$@" timeout 60 "$RUN" -np "$np" "$PROBE" 1 0 -1 0 0 2>&1)
  rc=$?
  [[ $rc != 0 ]] || fail "$name: exit code 0: $out"
  grep -qF -- "$want" <<<"$out" || fail "$name: no '$want' in: $out"
}
expect_error too_many_servers 3 "allowed are 1 to size - 1 = 2 servers" KOLO_BACKEND=ps \
  KOLO_PS_SERVERS=3
expect_error duplicate_rank 4 "parameter-server rank 2 is listed twice" KOLO_BACKEND=ps \
  KOLO_PS_SERVER_RANKS=2,2
expect_error out_of_range 4 "parameter-server rank 7 is outside [0, 4)" KOLO_BACKEND=ps \
  KOLO_PS_SERVER_RANKS=7
expect_error unknown_placement 3 "placement 'roundrobin' is unknown: allowed are greedy, split" \
  KOLO_BACKEND=ps KOLO_PS_PLACEMENT=roundrobin

if [[ $HAVE_MPIRUN == 0 ]]; then
  echo "note: mpirun runs not checked (no mpirun or no MPI in this build)"
fi
if [[ $FAILURES -gt 0 ]]; then
  echo "$FAILURES check(s) failed"
  exit 1
fi
echo "ps_mp: all checks passed"
