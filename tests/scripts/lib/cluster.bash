# Helpers for the emulated-cluster tests (tests/scripts/cluster*.sh). Sourced; expects `root` (the
# repository root) and `fail` to be defined.
#
# cluster_gate: exit 77 naming the reason unless `scripts/cluster check` passes.
# cluster_gate_mpi BIN: also exit 77 without mpirun or without MPI in the build.
# cluster_name PREFIX: a cluster name of this test process (PREFIX + pid), set in `name`.
# cluster_teardown: `scripts/cluster down` of `name` (for the EXIT trap).
# shellcheck disable=SC2154  # root, work and fault_at are the sourcing test's

cluster=$root/scripts/cluster
name=

cluster_gate() {
  local why
  if ! why=$("$cluster" check 2>&1); then
    echo "SKIP: scripts/cluster check says this machine cannot host a cluster: $why"
    exit 77
  fi
}

cluster_gate_mpi() {
  command -v mpirun >/dev/null || { echo "SKIP: mpirun not found"; exit 77; }
  grep -q "KOLO_HAVE_MPI 1" "$1/../generated/kolo/config.h" 2>/dev/null ||
    { echo "SKIP: this build has no MPI"; exit 77; }
}

cluster_name() {
  name=$1$$
}

cluster_teardown() {
  if [[ -n $name ]]; then "$cluster" down --name "$name" >/dev/null 2>&1 || true; fi
}

# cluster_status_py CODE: runs the Python CODE with `s`, the cluster's `status --json`.
cluster_status_py() {
  "$cluster" status --name "$name" --json | python3 -c "import json, sys; s = json.load(sys.stdin); $1"
}

# cluster_leftovers: prints what cluster `name` left behind (namespaces, state), or nothing.
cluster_leftovers() {
  ip netns list | awk '{print $1}' | grep -E "^$name-(sw|h[0-9]+)$" || true
  [[ ! -e /run/kolo-cluster/$name ]] || echo "/run/kolo-cluster/$name"
}

# --- Training jobs across the cluster, each rank's output in its own file ($work/rankK.log, written
# by the rank's host directly, so a rank cut off from mpirun still leaves its log).

job=
peer_timeout_s=5

# cluster_train_start TRAIN PROFILE: kolo-train (replay compute, ResNet-101, batch 64, endless) on
# every host, 1 rank per host, peer timeout $peer_timeout_s, rank 0's record in $work/run.json;
# the launcher's pid in `job`.
cluster_train_start() {
  cat >"$work/rank.sh" <<'SH'
#!/bin/sh
exec "$@" >"$KOLO_TEST_LOGS/rank$OMPI_COMM_WORLD_RANK.log" 2>&1
SH
  chmod +x "$work/rank.sh"
  rm -f "$work"/rank*.log "$work/launcher.rc"
  # In a subshell that records the launcher's status: Open MPI's mpirun, stopped while it waits on
  # a daemon it cannot reach, may crash on the way out, and bash would report that on stderr.
  (
    rc=0
    KOLO_TEST_LOGS=$work timeout 300 "$cluster" mpirun --name "$name" -- -x KOLO_TEST_LOGS \
      --bind-to none "$work/rank.sh" "$1" --model resnet101 --batch-size 64 --compute replay \
      --profile "$2" --num-warmup-batches 1 --num-batches 100000 --display-every 1 \
      --peer-timeout-s "$peer_timeout_s" --json "$work/run.json" >"$work/mpirun.out" 2>&1 || rc=$?
    echo "$rc" >"$work/launcher.rc"
  ) 2>/dev/null &
  job=$!
}

# cluster_launcher_rc: the launcher's exit status, once `job` has ended.
cluster_launcher_rc() {
  wait "$job" 2>/dev/null || true
  cat "$work/launcher.rc" 2>/dev/null || echo "unknown"
}

# cluster_wait_step: waits (up to 120 s) for rank 0's first timed step line.
cluster_wait_step() {
  local waited
  for ((waited = 0; waited < 1200; waited++)); do
    grep -Eq $'^[0-9]+\timages/sec' "$work/rank0.log" 2>/dev/null && return 0
    kill -0 "$job" 2>/dev/null || { tail -20 "$work"/rank*.log "$work/mpirun.out"; fail "the job ended before its first step"; }
    sleep 0.1
  done
  fail "no step line within 120 s"
}

# cluster_wait_errors BOUND RANK...: waits until each RANK's log has kolo-train's error line, at
# most BOUND seconds after `fault_at` ($EPOCHREALTIME of the fault); sets took[RANK] (seconds).
declare -A took
cluster_wait_errors() {
  local bound=$1 r now
  shift
  local -a left=("$@")
  while ((${#left[@]})); do
    local -a still=()
    for r in "${left[@]}"; do
      if grep -q "^kolo-train rank $r: error:" "$work/rank$r.log" 2>/dev/null; then
        # shellcheck disable=SC2034  # read by the sourcing test
        took[$r]=$(awk -v a="$fault_at" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
      else
        still+=("$r")
      fi
    done
    left=("${still[@]}")
    ((${#left[@]})) || break
    now=$(awk -v a="$fault_at" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d", b - a }')
    if ((now > bound)); then
      tail -5 "$work"/rank*.log
      fail "rank(s) ${left[*]} did not fail within $bound s of the fault"
    fi
    sleep 0.1
  done
}

# cluster_error RANK: rank RANK's error line.
cluster_error() { grep -m1 "^kolo-train rank $1: error:" "$work/rank$1.log"; }

# cluster_blamed RANK: the ranks RANK's error calls silent or lost, sorted, space-separated.
cluster_blamed() {
  cluster_error "$1" | grep -Eo "rank [0-9]+ (has sent nothing|for [0-9.]+ s)|connection to rank [0-9]+ lost" |
    grep -Eo "[0-9]+ (has|for|lost)" | cut -d' ' -f1 | sort -un | tr '\n' ' ' | sed 's/ $//'
}

# cluster_down_clean: down, then nothing of the cluster or the job is left.
cluster_down_clean() {
  timeout 60 "$cluster" down --name "$name" >"$work/down.out" 2>&1 || { cat "$work/down.out"; fail "down exited $?"; }
  local waited
  for ((waited = 0; waited < 100; waited++)); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$job" 2>/dev/null && fail "the launcher is still running after down"
  echo "the launcher ended with status $(cluster_launcher_rc)"
  local left
  left=$(cluster_leftovers)
  [[ -z $left ]] || fail "down left: $left"
  left=$(pgrep -f -- "--json $work/run.json" || true)
  [[ -z $left ]] || fail "processes of the job left: $left"
  echo "ok: down left nothing ($(tr '\n' ' ' <"$work/down.out"))"
}
