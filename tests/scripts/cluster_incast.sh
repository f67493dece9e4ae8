#!/usr/bin/env bash
# scripts/cluster-incast: bad arguments exit 2 naming the value; 2 workers sending 4 MB each into
# one host of a 1 Gbit/s cluster reach about the link's payload rate (tbf counts 1514-byte frames
# for 1448 payload bytes: 119.5 MB/s), one way and both ways at once, the streams' front each way
# is measured, and nothing is left behind (no namespace of its cluster, no state).
# Usage: cluster_incast.sh BIN_DIR (unused). Exit 77 (skip) when scripts/cluster check fails.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL: $*"; exit 1; }
# shellcheck source=tests/scripts/lib/cluster.bash
source "$(dirname "$0")/lib/cluster.bash"

for bad in "--workers 0" "--workers x" "--runs 0" "--size 1K" "--sockbuf x" "--frobnicate 1"; do
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
KOLO_OUT=$work timeout 300 "$root/scripts/cluster-incast" --workers 2 --size 4M --runs 1 --sockbuf 4194304 \
  >"$work/log" 2>&1 ||
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
# The streams' front each way, against a fair share (two streams share about fairly), and the
# spread kolo-sim takes from it.
assert s["socket_buffer_bytes"] == 4194304, s
for front_in, front_out in s["front_share_in_out"]["both"]:
    assert 0.5 < front_in < 1.2 and 0.5 < front_out < 1.2, s["front_share_in_out"]
assert -0.2 < s["ps_stream_spread"] < 0.5, s["ps_stream_spread"]
PY
after=$(ip netns list | grep -c '^incast' || true)
((after == before)) || fail "namespaces left behind: $(ip netns list | grep '^incast')"
echo "ok: $(grep 'both / push' "$work/log")"
