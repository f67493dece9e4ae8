#!/usr/bin/env bash
# A host dies: kolo-train (replay compute, ResNet-101, ring) on 4 emulated hosts at 1 Gbit/s;
# after the first timed step every process in h2 (its rank and Open MPI's daemon) gets SIGKILL.
# Every surviving rank (0, 1, 3) must fail within the peer timeout (5 s) plus 10 s with an error
# naming rank 2 (and no other rank), mpirun must end non-zero within 30 s, and `down` leaves
# nothing.
# Usage: cluster_fault_kill.sh BIN_DIR. Exit 77 (skip) when scripts/cluster check fails, without
# mpirun or without MPI in the build.
set -euo pipefail

bin=${1:?usage: cluster_fault_kill.sh BIN_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL: $*"; exit 1; }
# shellcheck source=tests/scripts/lib/cluster.bash
source "$(dirname "$0")/lib/cluster.bash"
[[ -x $bin/kolo-train ]] || { echo "SKIP: $bin/kolo-train not built"; exit 77; }
cluster_gate
cluster_gate_mpi "$bin"

cluster_name tfk
work=$(mktemp -d)
trap 'cluster_teardown; rm -rf "$work"' EXIT
"$cluster" up --hosts 4 --link 1gbit --name "$name" >/dev/null || fail "up exited $?"
cluster_train_start "$bin/kolo-train" "$root/models/profiles/resnet101-h100-b64.json"
cluster_wait_step
mapfile -t victims < <(ip netns pids "$name-h2")
ps -o pid=,comm= -p "$(IFS=,; echo "${victims[*]}")" | grep -q kolo-train || fail "no kolo-train in h2: ${victims[*]}"
fault_at=$EPOCHREALTIME
kill -KILL "${victims[@]}"
echo "SIGKILL to every process in h2: ${victims[*]}"

cluster_wait_errors $((peer_timeout_s + 10)) 0 1 3
for r in 0 1 3; do
  echo "rank $r failed ${took[$r]} s after the fault: $(cluster_error "$r" | cut -c1-240)"
  cluster_error "$r" | grep -Eq "rank 2" || fail "rank $r's error does not name rank 2: $(cluster_error "$r")"
  blamed=$(cluster_blamed "$r")
  [[ -z $blamed || $blamed == 2 ]] || fail "rank $r's error blames rank(s) '$blamed', not rank 2: $(cluster_error "$r")"
done
for ((waited = 0; waited < 300; waited++)); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
kill -0 "$job" 2>/dev/null && { tail -20 "$work/mpirun.out"; fail "mpirun still running 30 s after the host died"; }
rc=$(cluster_launcher_rc)
[[ $rc != 0 ]] || fail "mpirun exited 0 after a host died"
echo "mpirun ended with status $rc: $(grep -m1 -E "rank 2|lost communication|h2" "$work/mpirun.out" || true)"
cluster_down_clean
echo "PASS"
