#!/usr/bin/env bash
# A host's link goes down mid-allreduce: kolo-train (replay compute, ResNet-101, ring) on 4
# emulated hosts at 1 Gbit/s, where every step is about 2 s of allreduce; after the first timed
# step, h2's switch port is taken down. Every surviving rank (0, 1, 3) must fail within the peer
# timeout (5 s) plus 10 s, its error naming rank 2 as the silent one and no other; rank 0's
# record keeps that error. Then `down` ends the launcher (which waits on h2's unreachable daemon)
# and leaves nothing.
# Usage: cluster_fault_link.sh BIN_DIR. Exit 77 (skip) when scripts/cluster check fails, without
# mpirun or without MPI in the build.
set -euo pipefail

bin=${1:?usage: cluster_fault_link.sh BIN_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL: $*"; exit 1; }
# shellcheck source=tests/scripts/lib/cluster.bash
source "$(dirname "$0")/lib/cluster.bash"
[[ -x $bin/kolo-train ]] || { echo "SKIP: $bin/kolo-train not built"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 is needed to read the run record"; exit 77; }
cluster_gate
cluster_gate_mpi "$bin"

cluster_name tfl
work=$(mktemp -d)
trap 'cluster_teardown; rm -rf "$work"' EXIT
"$cluster" up --hosts 4 --link 1gbit --name "$name" >/dev/null || fail "up exited $?"
sw=$(cluster_status_py 'print(s["switch_namespace"])')
cluster_train_start "$bin/kolo-train" "$root/models/profiles/resnet101-h100-b64.json"
cluster_wait_step
# Mid-allreduce: bytes are crossing h2's link right now.
b0=$(tc -n "$sw" -s qdisc show dev v2 | awk '/Sent/ {print $2; exit}')
sleep 0.3
b1=$(tc -n "$sw" -s qdisc show dev v2 | awk '/Sent/ {print $2; exit}')
((b1 > b0)) || fail "no bytes crossed h2's link in 0.3 s of training"
fault_at=$EPOCHREALTIME
ip -n "$sw" link set v2 down
echo "h2's link down ($((b1 - b0)) bytes crossed it in the 0.3 s before)"

cluster_wait_errors $((peer_timeout_s + 10)) 0 1 3
for r in 0 1 3; do
  echo "rank $r failed $((${took[$r]%.*})) s after the fault (${took[$r]} s): $(cluster_error "$r" | cut -c1-240)"
  blamed=$(cluster_blamed "$r")
  [[ $blamed == 2 ]] || fail "rank $r's error blames rank(s) '$blamed', expected only rank 2: $(cluster_error "$r")"
done
python3 - "$work/run.json" <<'PY' || fail "rank 0's record"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["status"] == "failed" and "rank 2 has sent nothing" in r["error"], r.get("error")
print("rank 0's record: failed:", r["error"][:160])
PY
cluster_down_clean
echo "PASS"
