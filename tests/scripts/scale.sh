#!/usr/bin/env bash
# Scale: kolo-allreduce-bench with many ranks on this one host, the default transport (auto:
# shared memory), every algorithm alone and through the engine, results checked. CI's slice is
# 128 ranks under kolo-run with small buffers (4 KiB and 64 KiB), bounded in time; each rank must
# hold at most 2 + ceil(log2 n) connections and report its memory. An unknown algorithm must be
# refused before any work (exit 2), naming the allowed ones, and so must one-shot over TCP. The full counts (16, 64, 128 ranks
# under kolo-run and mpirun, 256 over TCP, 4 MiB buffers) run from scripts/scale-bench.
# $1: the build's bin directory. KOLO_SCALE_RANKS overrides the rank count.
set -u -o pipefail

BIN=${1:?usage: scale.sh BUILD_BIN_DIR}
BENCH=$BIN/kolo-allreduce-bench
KOLO_RUN=$BIN/kolo-run
[[ -x $BENCH ]] || { echo "FAIL: $BENCH not built"; exit 1; }
[[ -x $KOLO_RUN ]] || { echo "FAIL: $KOLO_RUN not built"; exit 1; }
command -v python3 >/dev/null || { echo "SKIP: python3 is needed to read the JSON"; exit 77; }

NP=${KOLO_SCALE_RANKS:-128}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# 1. The bad algorithm: refused at once, exit 2, naming what is allowed.
timeout 60 "$KOLO_RUN" -np 2 "$BENCH" -b 4K -e 4K --algorithms ring,tree >"$WORK/bad.out" 2>&1
rc=$?
if ((rc != 2)); then fail "--algorithms ring,tree exited $rc, expected 2"; fi
grep -q "allowed are a comma list of auto, ring, recursive-doubling, halving-doubling" \
  "$WORK/bad.out" || fail "the refusal does not name the allowed algorithms: $(head -3 "$WORK/bad.out")"
KOLO_ALLREDUCE_ALGORITHM=tree timeout 60 "$KOLO_RUN" -np 2 "$BENCH" -b 4K -e 4K \
  >"$WORK/bad-env.out" 2>&1
rc=$?
if ((rc != 2)); then fail "KOLO_ALLREDUCE_ALGORITHM=tree exited $rc, expected 2"; fi
grep -q "allreduce algorithm 'tree' is unknown" "$WORK/bad-env.out" ||
  fail "KOLO_ALLREDUCE_ALGORITHM=tree: $(head -3 "$WORK/bad-env.out")"

# One-shot needs the host area: over TCP it is refused before any work, naming the others.
timeout 60 "$KOLO_RUN" -np 2 "$BENCH" -b 4K -e 4K --transport tcp --algorithms one-shot \
  >"$WORK/bad-oneshot.out" 2>&1
rc=$?
if ((rc != 2)); then fail "--transport tcp --algorithms one-shot exited $rc, expected 2"; fi
grep -q "one-shot needs every rank on one host over shared memory" "$WORK/bad-oneshot.out" ||
  fail "--transport tcp --algorithms one-shot: $(head -3 "$WORK/bad-oneshot.out")"

# 2. NP ranks, the default transport, every algorithm.
start=$(date +%s.%N)
timeout 420 "$KOLO_RUN" -np "$NP" "$BENCH" -b 4K -e 64K -f 16 -n 3 -w 1 \
  --algorithms ring,recursive-doubling,halving-doubling,one-shot,auto --json "$WORK/scale.json" \
  >"$WORK/scale.out" 2>&1
rc=$?
end=$(date +%s.%N)
echo "--- $NP ranks (exit $rc, $(python3 -c "print(f'{$end - $start:.1f}')") s)"
tail -n 30 "$WORK/scale.out"
if ((rc != 0)); then
  fail "$NP ranks exited $rc"
else
  python3 - "$WORK/scale.json" "$NP" <<'EOF' || fail "$NP ranks: JSON check"
import json, math, sys
doc = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
assert doc["ranks"] == n, doc["ranks"]
labels = {r["backend"] for r in doc["rows"]}
for a in ("ring", "recursive-doubling", "halving-doubling", "one-shot", "auto"):
    for kind in ("alone", "ring"):
        assert f"{kind}/{a}" in labels, f"{kind}/{a} missing from {sorted(labels)}"
for r in doc["rows"]:
    assert r["checked"] and r["wrong"] == 0, f"{r['backend']} at {r['bytes']}: {r['wrong']} wrong"
algos = doc["algorithms"]
assert len(algos) == 2 * 5, algos
picked = {a["bytes"]: a["picked"] for a in algos if a["algorithm"] == "auto"}
# One host over shared memory: the host area's one-shot while (N - 1) x 4 KiB <= 1 MiB.
assert picked == {4096: "one-shot" if n <= 257 else "recursive-doubling",
                  65536: "halving-doubling"}, picked
res = doc["rank_resources"]
assert len(res) == n, len(res)
bound = 2 + math.ceil(math.log2(n)) if n > 16 else n - 1
for i, r in enumerate(res):
    assert 0 < r["connections"] <= bound, f"rank {i}: {r['connections']} connections > {bound}"
    assert 0 < r["engine_connections"] <= bound, f"rank {i}: engine {r['engine_connections']}"
    assert r["peak_rss_bytes"] > 0, r
print(f"ok: {n} ranks, at most {max(r['connections'] for r in res)} connections per rank "
      f"(bound {bound}), peak RSS max {max(r['peak_rss_bytes'] for r in res) / 2**20:.1f} MiB, "
      f"first collective by {max(r['first_collective_s'] for r in res):.2f} s")
EOF
fi

if ((failures > 0)); then echo "FAILED: $failures check(s)"; exit 1; fi
echo "PASS"
