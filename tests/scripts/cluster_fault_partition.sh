#!/usr/bin/env bash
# A network partition: kolo-train (replay compute, ResNet-101, ring) on 4 emulated hosts at
# 1 Gbit/s; after the first timed step, h2 and h3 are cut off from h0 and h1 (their switch ports
# move to a second bridge). Every rank must fail within the peer timeout (5 s) plus 10 s, each
# naming as silent only ranks on the other side. Then `down` leaves nothing.
# Usage: cluster_fault_partition.sh BIN_DIR. Exit 77 (skip) when scripts/cluster check fails,
# without mpirun or without MPI in the build.
set -euo pipefail

bin=${1:?usage: cluster_fault_partition.sh BIN_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL: $*"; exit 1; }
# shellcheck source=tests/scripts/lib/cluster.bash
source "$(dirname "$0")/lib/cluster.bash"
[[ -x $bin/kolo-train ]] || { echo "SKIP: $bin/kolo-train not built"; exit 77; }
cluster_gate
cluster_gate_mpi "$bin"

cluster_name tfp
work=$(mktemp -d)
trap 'cluster_teardown; rm -rf "$work"' EXIT
"$cluster" up --hosts 4 --link 1gbit --name "$name" >/dev/null || fail "up exited $?"
cluster_train_start "$bin/kolo-train" "$root/models/profiles/resnet101-h100-b64.json"
cluster_wait_step
fault_at=$EPOCHREALTIME
"$cluster" partition --name "$name" h2 h3 || fail "partition exited $?"
# The cut is real: h0 reaches h1 but not h2.
a1=$("$cluster" hosts --name "$name" | awk '$1 == "h1" {print $2}')
a2=$("$cluster" hosts --name "$name" | awk '$1 == "h2" {print $2}')
"$cluster" exec --name "$name" h0 ping -c 1 -W 1 -q "$a1" >/dev/null || fail "h0 cannot reach h1 in its own half"
"$cluster" exec --name "$name" h0 ping -c 1 -W 1 -q "$a2" >/dev/null && fail "h0 still reaches h2 across the partition"

cluster_wait_errors $((peer_timeout_s + 10)) 0 1 2 3
for r in 0 1 2 3; do
  echo "rank $r failed ${took[$r]} s after the partition: $(cluster_error "$r" | cut -c1-240)"
  blamed=$(cluster_blamed "$r")
  [[ -n $blamed ]] || fail "rank $r's error names no silent rank: $(cluster_error "$r")"
  for b in $blamed; do
    if ((r < 2 && b < 2 || r >= 2 && b >= 2)); then
      fail "rank $r blames rank $b, on its own side of the partition: $(cluster_error "$r")"
    fi
  done
done
cluster_down_clean
echo "PASS"
