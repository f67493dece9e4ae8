#!/usr/bin/env bash
# scripts/cluster-incast: bad arguments exit 2 naming the value; 2 workers sending 4 MB each into
# one host of a 1 Gbit/s cluster reach about the link's payload rate (tbf counts 1514-byte frames
# for 1448 payload bytes: 119.5 MB/s), one way and both ways at once, the streams' front each way
# is measured, so is the front in a parameter server's rounds (pulls after each shard's pushes),
# whose mean gives ps_stream_spread, and nothing is left behind (no namespace of its cluster, no
# state).
# Usage: cluster_incast.sh BIN_DIR (unused). Exit 77 (skip) when scripts/cluster check fails.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL: $*"; exit 1; }
# shellcheck source=tests/scripts/lib/cluster.bash
source "$(dirname "$0")/lib/cluster.bash"

for bad in "--workers 0" "--workers x" "--runs 0" "--size 1K" "--sockbuf x" "--rounds 1" "--shards 0" "--cc nosuch" "--pace x" \
  "--frobnicate 1"; do
  # shellcheck disable=SC2086
  if out=$("$root/scripts/cluster-incast" $bad 2>&1); then fail "'$bad' was accepted"; fi
  rc=0
  # shellcheck disable=SC2086
  "$root/scripts/cluster-incast" $bad >/dev/null 2>&1 || rc=$?
  ((rc == 2)) || fail "'$bad' exited $rc, not 2: $out"
  [[ $out == *"${bad%% *}"* ]] || fail "'$bad': the error does not name it: $out"
done

cluster_gate
command -v python3 >/dev/null || { echo "SKIP: python3 is needed for the flows"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
before=$(ip netns list | grep -c '^incast' || true)
# 3 runs (each under a second): the rates are medians, so that one run held up on a busy host does
# not decide them.
KOLO_OUT=$work timeout 300 "$root/scripts/cluster-incast" --workers 2 --size 4M --runs 3 --sockbuf 4194304 \
  --rounds 3 --shards 4 --pace 100000000 >"$work/log" 2>&1 ||
  fail "cluster-incast exited $?: $(cat "$work/log")"
python3 - "$work/cluster-incast/summary.json" <<'PY' || fail "summary: $(cat "$work/log")"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["workers"] == 2 and s["bytes"] == 4 << 20, s
for mode in ("push", "both"):
    rate = s["bytes_per_s"][mode]
    # The link's payload rate is 119.5 MB/s; TCP's start and the short transfer cost some.
    assert 0.6 * 119.5e6 < rate < 1.05 * 119.5e6, (mode, rate)
assert 0.6 < s["duplex_ratio"] < 1.1, s["duplex_ratio"]
# The streams' front each way, against a fair share: never ahead of it by more than the timing's
# grain, and (short transfers, a shaped queue) anywhere from starved to fair.
assert s["socket_buffer_bytes"] == 4194304 and s["congestion_control"], s
assert s["pace_bytes_per_s"] == 100000000, s
for front_in, front_out in s["front_share_in_out"]["both"]:
    assert 0 <= front_in < 1.2 and 0 <= front_out < 1.2, s["front_share_in_out"]
# Rounds: 3 runs of 3, the front measured in the 2 after the first of each, the spread 1 minus the
# mean of the 6.
assert s["rounds"] == 3 and s["shards"] == 4, s
fronts = s["round_front_shares"]
assert len(fronts) == 3 and all(len(run) == 2 for run in fronts), fronts
every = [x for run in fronts for x in run]
assert all(0 <= x < 1.5 for x in every), fronts
assert abs(s["ps_stream_spread"] - (1 - sum(every) / 6)) < 1e-9, s["ps_stream_spread"]
PY
after=$(ip netns list | grep -c '^incast' || true)
((after == before)) || fail "namespaces left behind: $(ip netns list | grep '^incast')"
echo "ok: $(grep 'both / push' "$work/log")"
