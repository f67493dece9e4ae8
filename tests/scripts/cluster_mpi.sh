#!/usr/bin/env bash
# kolo across emulated hosts: 3 hosts x 1 rank at 1 Gbit/s, launched by `scripts/cluster mpirun`.
# kolo-allreduce-bench's ring and link rows run and check out, report the 3 ranks on 3 distinct
# hosts (h0, h1, h2: each rank sees its own host name), and every host's shaped link carried at
# least the bytes the ring must send (2(n-1)/n of the buffer per allreduce, each way). Then
# kolo-train (replay compute, ResNet-101) trains two steps: its record names the 3 hosts, and while
# it runs its data connections join the hosts' own addresses (each rank has local_size 1, so it
# listens on its host's address, not on loopback). KOLO_IFACE=kolo0 works on every host.
# Usage: cluster_mpi.sh BIN_DIR. Exit 77 (skip) when scripts/cluster check fails, without mpirun
# or without MPI in the build.
set -euo pipefail

bin=${1:?usage: cluster_mpi.sh BIN_DIR}
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

cluster_name tm
work=$(mktemp -d)
trap 'cluster_teardown; rm -rf "$work"' EXIT
"$cluster" up --hosts 3 --link 1gbit --name "$name" || fail "up exited $?"
mpi=(timeout 120 "$cluster" mpirun --name "$name" -- -x MALLOC_MMAP_THRESHOLD_=4294967295
     --bind-to none)

counters() {
  cluster_status_py 'print(" ".join("%d %d" % (h["egress"]["bytes"], h["ingress"]["bytes"]) for h in s["host_list"]))'
}

# --- The bench: 16 MiB, ring and link rows, 1 warm-up + 2 timed iterations each.
before=$(counters)
"${mpi[@]}" "$bench" -b 16M -e 16M --backend ring,link -n 2 -w 1 --json "$work/bench.json" \
  >"$work/bench.out" 2>&1 || { cat "$work/bench.out"; fail "the bench exited $?"; }
after=$(counters)
cat "$work/bench.out"
grep -q "3 ranks on 3 host(s) (h0, h1, h2)" "$work/bench.out" || fail "the bench does not report 3 hosts"
python3 - "$work/bench.json" <<'EOF' || fail "bench JSON"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ranks"] == 3, d["ranks"]
assert d["hosts"] == ["h0", "h1", "h2"], d["hosts"]
assert d["rank_hosts"] == ["h0", "h1", "h2"], d["rank_hosts"]
rows = {r["backend"]: r for r in d["rows"]}
assert set(rows) == {"ring", "link"}, rows.keys()
assert rows["ring"]["checked"] and rows["ring"]["wrong"] == 0, rows["ring"]
for r in rows.values():
    assert r["bytes"] == 16 << 20 and r["busbw_gbs"] > 0, r
    # Over a 1 Gbit/s link busbw cannot pass 0.125 GB/s (the link's rate in bytes).
    assert r["busbw_gbs"] < 0.125, f"{r['backend']}: {r['busbw_gbs']} GB/s is more than the link carries"
print("bench JSON: ok:", {k: round(v["busbw_gbs"], 4) for k, v in rows.items()})
EOF
# Each of the 6 allreduces (2 rows x 3 iterations) sends 2(n-1)/n x 16 MiB from every rank and
# receives as much; tbf counts L2 bytes, more than the payload.
python3 - "$before" "$after" <<'EOF' || fail "tbf counters"
import sys
before = list(map(int, sys.argv[1].split()))
after = list(map(int, sys.argv[2].split()))
need = 6 * 2 * 2 / 3 * (16 << 20)
for i in range(3):
    sent, received = after[2 * i] - before[2 * i], after[2 * i + 1] - before[2 * i + 1]
    print(f"h{i}: sent {sent} B, received {received} B over its shaped link; "
          f"the ring must move {need:.0f} each way ({sent / need:.3f}x, {received / need:.3f}x)")
    assert sent >= need and received >= need, f"h{i}: fewer bytes than the ring must move"
EOF

# --- KOLO_IFACE names the same interface on every host (kolo0), as eth0 would on a real cluster.
"${mpi[@]}" -x KOLO_IFACE=kolo0 "$bench" -b 1M -e 1M --backend ring -n 2 -w 1 >"$work/iface.out" 2>&1 ||
  { cat "$work/iface.out"; fail "the bench with KOLO_IFACE=kolo0 exited $?"; }
grep -q "listen kolo0" "$work/iface.out" || fail "the bench does not report listening on kolo0"
grep -Eq "^ +1048576 .* ring .* 0 +0$" "$work/iface.out" || fail "no checked ring row with KOLO_IFACE=kolo0"
echo "ok: KOLO_IFACE=kolo0 on every host"

# --- kolo-train, 2 steps of ResNet-101 (replay of a oneDNN profile, batch 16).
rm -f "$work/run.json"
"${mpi[@]}" "$train" --model resnet101 --batch-size 16 --compute replay \
  --profile "$root/models/profiles/resnet101-onednn-b16.json" --num-warmup-batches 0 \
  --num-batches 2 --display-every 1 --peer-timeout-s 30 --json "$work/run.json" \
  >"$work/train.out" 2>&1 &
job=$!
# While it trains: h1's rank has TCP connections from h1's address to h0's and h2's.
a0=$("$cluster" hosts --name "$name" | awk '$1 == "h0" {print $2}')
a1=$("$cluster" hosts --name "$name" | awk '$1 == "h1" {print $2}')
a2=$("$cluster" hosts --name "$name" | awk '$1 == "h2" {print $2}')
# (Open MPI's own TCP connections between the ranks may come up before kolo's engine listens:
# the loop waits for both, and keeps every listening socket it saw.)
seen=
: >"$work/listen"
for _ in $(seq 300); do
  ip netns exec "$name-h1" ss -Htnp state established 2>/dev/null | grep '"kolo-train"' >"$work/ss" || true
  ip netns exec "$name-h1" ss -Htlnp 2>/dev/null | grep '"kolo-train"' >>"$work/listen" || true
  if grep -q " $a1:[0-9]* *$a0:" "$work/ss" && grep -q " $a1:[0-9]* *$a2:" "$work/ss" &&
    grep -q " $a1:[0-9]" "$work/listen"; then
    seen=1
    break
  fi
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
rc=0
wait "$job" || rc=$?
cat "$work/train.out"
((rc == 0)) || fail "kolo-train exited $rc"
[[ -n $seen ]] || fail "h1's kolo-train never had connections $a1 -> $a0 and $a1 -> $a2 with a socket listening on $a1: $(cat "$work/ss"); listening: $(sort -u "$work/listen")"
echo "ok: h1's kolo-train connected from its host address $a1 to $a0 and $a2"
# kolo's own listening socket is on the host's address; nothing of kolo-train listens on loopback
# (its one loopback connection is MPI's, to the local daemon).
grep -q " $a1:[0-9]" "$work/listen" || fail "h1's kolo-train listens on no socket of $a1: $(sort -u "$work/listen")"
if grep -q "127\.0\.0\.1:" "$work/listen"; then fail "h1's kolo-train listens on loopback: $(cat "$work/listen")"; fi
python3 - "$work/run.json" <<'EOF' || fail "run record"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["status"] == "ok", r.get("error")
assert r["hosts"] == ["h0", "h1", "h2"], r["hosts"]
assert r["settings"]["ranks"] == 3 and r["settings"]["nodes"] == 3, r["settings"]
assert r["results"]["total_images_per_sec"] > 0, r["results"]
print("run record: ok: hosts", r["hosts"], "nodes", r["settings"]["nodes"])
EOF

"$cluster" down --name "$name" >/dev/null 2>&1 || fail "down exited $?"
left=$(cluster_leftovers)
[[ -z $left ]] || fail "down left: $left"
echo "PASS"
