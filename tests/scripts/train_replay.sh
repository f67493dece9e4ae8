#!/usr/bin/env bash
# kolo-train with replay compute under kolo-run, which every build has (no MPI, oneDNN or CUDA
# needed): ResNet-101 from its shipped H100 profile over the TCP ring at 2 ranks, and over one
# parameter server beside 2 workers. Each run must exit 0, say compute=replay on every line, and
# its record must show every step's gradients reduced: ResNet-101's 314 gradients per step through
# the ring (most of their bytes fused), bytes pushed and pulled and updates applied on the server.
# Then bad inputs (NaN hyper-parameters, an unbounded --profile, an unwritable --json) must exit 2
# at start-up, and a symbolic link planted where --json or the timeline goes must not be followed.
# Usage: train_replay.sh BIN_DIR   (exit 77 = skipped)
set -euo pipefail

bin=${1:?usage: train_replay.sh BIN_DIR}
train=$bin/kolo-train
run=$bin/kolo-run
root=$(cd "$(dirname "$0")/../.." && pwd)
profile=$root/models/profiles/resnet101-h100-b64.json
for tool in "$train" "$run"; do
  [[ -x $tool ]] || { echo "SKIP: $tool not built"; exit 77; }
done
command -v python3 >/dev/null || { echo "SKIP: python3 is needed to read the run records"; exit 77; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

warmup=2
batches=4
common=(--model resnet101 --batch-size 64 --compute replay --profile "$profile"
        --num-warmup-batches "$warmup" --num-batches "$batches" --display-every 2
        --peer-timeout-s 60)

# train NAME NP FLAGS...: kolo-train under kolo-run at NP ranks, writing $work/NAME.{out,json};
# it must exit 0 and its total line say compute=replay.
train() {
  local name=$1 np=$2
  shift 2
  timeout 300 "$run" -np "$np" --timeout-s 280 "$train" "${common[@]}" --json "$work/$name.json" \
    "$@" >"$work/$name.out" 2>&1 || { cat "$work/$name.out"; fail "$name run exited non-zero"; }
  cat "$work/$name.out"
  grep -Eq '^total images/sec: [0-9.]+ \(compute=replay\)$' "$work/$name.out" ||
    fail "$name: the total line does not say compute=replay"
}

# --- ring over the default transport (auto: shared memory between ranks of one host), 2 ranks.
train ring 2
python3 - "$work/ring.json" "$((warmup + batches))" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
steps = int(sys.argv[2])
s, res = r["settings"], r["results"]
assert r["status"] == "ok", r
assert (s["compute"], s["backend"], s["transport"], s["ranks"]) == ("replay", "ring", "auto", 2), s
assert res["total_images_per_sec"] > 0, res
stats = res["engine_stats"]
# The default transport, auto, carries both ranks of this host over shared memory.
assert stats["transport_pairs"] == "shm", stats
# Every step allreduces each of the 314 gradients once, 44,549,160 float32 values in all; most go
# in fused groups (fused_bytes counts those; a tensor that happens to be agreed alone is not).
assert stats["tensors"] >= steps * 314 and stats["collectives"] >= steps, stats
everything = steps * 44549160 * 4
assert everything // 2 < stats["fused_bytes"] <= everything, (stats["fused_bytes"], everything)
print("ring record: ok")
EOF

# --- parameter server: 3 launch ranks = 2 workers + 1 server.
train ps 3 --backend ps --ps-servers 1
python3 - "$work/ps.json" "$((warmup + batches))" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
steps = int(sys.argv[2])
s, stats = r["settings"], r["results"]["engine_stats"]
assert r["status"] == "ok", r
assert (s["compute"], s["backend"], s["ranks"], s["ps_servers"]) == ("replay", "ps", 2, 1), s
# A worker pushes every gradient each step (at least the float32 bytes) and pulls it back.
assert stats["ps_bytes_sent"] >= steps * 44549160 * 4, stats
assert stats["ps_bytes_received"] >= steps * 44549160 * 4, stats
assert stats["ps_updates"] > 0, stats
print("parameter-server record: ok")
EOF
# --- inputs refused at start-up (exit 2, before any work), and files never written through a link.
expect_bad() {
  local needle=$1
  shift
  set +e
  timeout 60 "$train" "$@" >"$work/bad.out" 2>&1
  local rc=$?
  set -e
  [[ $rc == 2 ]] || { cat "$work/bad.out"; fail "'$*' exited $rc, expected 2"; }
  grep -qF -- "$needle" "$work/bad.out" || { cat "$work/bad.out"; fail "'$*': no '$needle'"; }
}
expect_bad "--learning-rate nan is not a number" "${common[@]}" --learning-rate nan
expect_bad "--momentum nan is not a number" "${common[@]}" --momentum nan
expect_bad "'/dev/zero' is a character device, not a regular file" --model resnet101 --batch-size 64 --compute replay \
  --profile /dev/zero
expect_bad "its directory '$work/none' does not exist" "${common[@]}" --json "$work/none/r.json"
if grep -q "KOLO_HAVE_ONEDNN 1" "$bin/../generated/kolo/config.h" 2>/dev/null; then
  # A batch far beyond memory: refused before oneDNN tries, naming what it needs and what fits.
  expect_bad "needs at least" --model resnet101 --batch-size 100000 --compute onednn \
    --num-batches 1 --backend none
fi
echo precious >"$work/victim"
ln -s "$work/victim" "$work/planted.json"
expect_bad "is a symbolic link" "${common[@]}" --json "$work/planted.json"
set +e
KOLO_TIMELINE=$work/planted.json timeout 60 "$train" "${common[@]}" >"$work/timeline.out" 2>&1
set -e
grep -qF "is a symbolic link" "$work/timeline.out" || { cat "$work/timeline.out"; fail "timeline link"; }
[[ $(<"$work/victim") == precious ]] || fail "a planted link's target was written"
echo "bad inputs and planted links: ok"
echo "PASS"
