#!/usr/bin/env bash
# Hierarchical allreduce across emulated hosts: 2 hosts x 2 ranks at 1 Gbit/s, launched by
# `scripts/cluster mpirun`, with the auto transport (shared memory within a host, TCP between).
# kolo-allreduce-bench's ring and ring-hier rows both check out, and the hosts' shaped links carry
# what each design says: with ranks numbered host by host, the flat ring sends 2(N-1)/N = 1.5
# buffers out of each host per allreduce (its rank at the host boundary sends all it sends across),
# the hierarchical one 2 ranks x 2(H-1)/H x 1/2 = 1 buffer. kolo-train with
# --hierarchical-allreduce trains two steps there and records it.
# Usage: cluster_hier.sh BIN_DIR. Exit 77 (skip) when scripts/cluster check fails, without mpirun
# or without MPI in the build.
set -euo pipefail

bin=${1:?usage: cluster_hier.sh BIN_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL: $*"; exit 1; }
# shellcheck source=tests/scripts/lib/cluster.bash
source "$(dirname "$0")/lib/cluster.bash"
bench=$bin/kolo-allreduce-bench
train=$bin/kolo-train
for tool in "$bench" "$train"; do [[ -x $tool ]] || { echo "SKIP: $tool not built"; exit 77; }; done
command -v python3 >/dev/null || { echo "SKIP: python3 is needed to read the JSON"; exit 77; }
cluster_gate
cluster_gate_mpi "$bin"

cluster_name th
work=$(mktemp -d)
trap 'cluster_teardown; rm -rf "$work"' EXIT
"$cluster" up --hosts 2 --ranks-per-host 2 --link 1gbit --name "$name" || fail "up exited $?"
mpi=(timeout 120 "$cluster" mpirun --name "$name" -- -x MALLOC_MMAP_THRESHOLD_=4294967295
     -x KOLO_TRANSPORT=auto --bind-to none)

egress() {
  cluster_status_py 'print(" ".join("%d" % h["egress"]["bytes"] for h in s["host_list"]))'
}

# bench ROW: 4 MiB, 1 warm-up + 2 timed iterations of ROW alone; prints the bytes each host sent
# over its link per allreduce, in buffers.
bench() {
  local before after
  before=$(egress)
  "${mpi[@]}" "$bench" -b 4M -e 4M --backend "$1" -n 2 -w 1 --json "$work/$1.json" \
    >"$work/$1.out" 2>&1 || { cat "$work/$1.out"; fail "the bench's $1 row exited $?"; }
  after=$(egress)
  grep -q "4 ranks on 2 host(s) (h0, h1)" "$work/$1.out" || fail "$1: the bench does not report 2 hosts"
  python3 - "$work/$1.json" "$1" "$before" "$after" <<'PY' || fail "$1: bench JSON"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["rank_hosts"] == ["h0", "h0", "h1", "h1"], d["rank_hosts"]
(row,) = [r for r in d["rows"] if r["backend"] == sys.argv[2]]
assert row["checked"] and row["wrong"] == 0, row
before, after = (list(map(int, a.split())) for a in sys.argv[3:5])
# 3 allreduces of 4 MiB; tbf counts L2 bytes (about 4.6% more than the payload).
print(" ".join(f"{(a - b) / (3 * (4 << 20)):.3f}" for a, b in zip(after, before)))
PY
}

flat=$(bench ring | tail -1)
hier=$(bench ring-hier | tail -1)
echo "buffers sent out of each host per allreduce: flat ring [$flat], hierarchical [$hier]"
python3 - "$flat" "$hier" <<'EOF' || fail "bytes across hosts"
import sys
flat = list(map(float, sys.argv[1].split()))
hier = list(map(float, sys.argv[2].split()))
for h, (f, x) in enumerate(zip(flat, hier)):
    # At least the design's bytes, at most 15% more (frame headers, keepalives, control).
    assert 1.5 <= f <= 1.5 * 1.15, f"h{h}: the flat ring sent {f} buffers, the design 1.5"
    assert 1.0 <= x <= 1.0 * 1.15, f"h{h}: the hierarchical allreduce sent {x} buffers, the design 1"
print("ok: the hierarchical allreduce sends 1 buffer out of each host where the flat ring sends 1.5")
EOF

# --- kolo-train, 2 steps of ResNet-101 (replay of a oneDNN profile, batch 16), hierarchical.
"${mpi[@]}" "$train" --model resnet101 --batch-size 16 --compute replay \
  --profile "$root/models/profiles/resnet101-onednn-b16.json" --num-warmup-batches 0 \
  --num-batches 2 --display-every 1 --peer-timeout-s 30 --hierarchical-allreduce \
  --json "$work/run.json" >"$work/train.out" 2>&1 || { cat "$work/train.out"; fail "kolo-train exited $?"; }
python3 - "$work/run.json" <<'EOF' || fail "run record"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["status"] == "ok", r.get("error")
assert sorted(set(r["hosts"])) == ["h0", "h1"], r["hosts"]
assert r["settings"]["hierarchical_allreduce"] is True, r["settings"]
print("run record: ok: hosts", r["hosts"], "hierarchical_allreduce true")
EOF

"$cluster" down --name "$name" >/dev/null 2>&1 || fail "down exited $?"
left=$(cluster_leftovers)
[[ -z $left ]] || fail "down left: $left"
echo "PASS"
