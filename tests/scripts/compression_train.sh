#!/usr/bin/env bash
# Gradient compression in training: kolo-train with oneDNN compute under kolo-run, 2 ranks, the
# tiny CNN trained for 12 steps with --compression none, fp16 and bf16 over the ring (auto
# transport), and once with fp16 over parameter servers. Each compressed run's final loss must
# lie within 2% of float32's (gradients rounded to half precision change the trajectory a little)
# yet differ from it (the gradients did travel in half), and its record must show the allreduce
# bytes on the wire halved (allreduce_wire_bytes) and the setting; the same for bf16 on the MPI
# backend under mpirun where the build has MPI. Then a bad value exits 2.
# scripts/compression-accuracy states the differences for every tiny net and a short ResNet-50.
# Usage: compression_train.sh BIN_DIR   (exit 77 = skipped)
set -euo pipefail

bin=${1:?usage: compression_train.sh BIN_DIR}
train=$bin/kolo-train
run=$bin/kolo-run
for tool in "$train" "$run"; do
  [[ -x $tool ]] || { echo "SKIP: $tool not built"; exit 77; }
done
command -v python3 >/dev/null || { echo "SKIP: python3 is needed to read the run records"; exit 77; }
if ! "$train" --model tiny-cnn --compute onednn --num-batches 1 --num-warmup-batches 0 \
    --batch-size 2 >/dev/null 2>&1; then
  echo "SKIP: this build has no oneDNN compute"
  exit 77
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

common=(--model tiny-cnn --compute onednn --batch-size 16 --num-warmup-batches 0
        --num-batches 12 --display-every 6 --peer-timeout-s 60)
for c in none fp16 bf16; do
  timeout 300 "$run" -np 2 --timeout-s 280 "$train" "${common[@]}" --compression "$c" \
    --json "$work/$c.json" >"$work/$c.out" 2>&1 || { cat "$work/$c.out"; fail "$c run failed"; }
done
timeout 300 "$run" -np 3 --timeout-s 280 "$train" "${common[@]}" --backend ps --compression fp16 \
  --json "$work/ps-fp16.json" >"$work/ps.out" 2>&1 || { cat "$work/ps.out"; fail "ps fp16 run failed"; }
timeout 300 "$run" -np 3 --timeout-s 280 "$train" "${common[@]}" --backend ps \
  --json "$work/ps-none.json" >"$work/ps0.out" 2>&1 || { cat "$work/ps0.out"; fail "ps run failed"; }

python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
rec = {c: json.load(open(f"{work}/{c}.json")) for c in ("none", "fp16", "bf16", "ps-none", "ps-fp16")}
for c, r in rec.items():
    assert r["status"] == "ok", (c, r)
base = rec["none"]["results"]["final_loss"]
for c in ("fp16", "bf16"):
    r = rec[c]
    assert r["settings"]["compression"] == c, r["settings"]
    loss = r["results"]["final_loss"]
    rel = abs(loss - base) / abs(base)
    print(f"{c}: final loss {loss:.6f} against float32's {base:.6f}: {100 * rel:.3f}% apart")
    assert loss != base, f"{c}: the same loss as float32: the gradients were not compressed"
    assert rel < 0.02, f"{c}: final loss {loss} is {100 * rel:.2f}% from float32's {base}"
    st = r["results"]["engine_stats"]
    # The gradients halve; the trainer's few float64 values (loss, images/sec) do not.
    assert 0.49 < st["allreduce_wire_bytes"] / st["allreduce_bytes"] < 0.51, st
    b0 = rec["none"]["results"]["comm_bytes_per_step"]
    b1 = r["results"]["comm_bytes_per_step"]
    assert 0.45 < b1 / b0 < 0.55, f"{c}: {b1} bytes a step against float32's {b0}"
ps0, ps1 = rec["ps-none"], rec["ps-fp16"]
l0, l1 = ps0["results"]["final_loss"], ps1["results"]["final_loss"]
print(f"ps fp16: final loss {l1:.6f} against float32's {l0:.6f}")
assert l1 != l0 and abs(l1 - l0) / abs(l0) < 0.02, (l0, l1)
# The workers' pushes halve; their pulls (the weights) stay float32.
b0, b1 = ps0["results"]["comm_bytes_per_step"], ps1["results"]["comm_bytes_per_step"]
assert 0.45 < b1 / b0 < 0.56, f"ps fp16: {b1} bytes pushed a step against float32's {b0}"
print("OK: compressed training within 2% of float32's loss, bytes halved")
PY

# --- The MPI backend under mpirun, where this build has MPI: MPI_Allreduce in half precision
# (kolo's float16/bfloat16 sum as a user operation), the bytes MPI moves halved.
if command -v mpirun >/dev/null && grep -q "KOLO_HAVE_MPI 1" "$bin/../generated/kolo/config.h" 2>/dev/null; then
  mpi=(mpirun --oversubscribe --allow-run-as-root --mca btl self,tcp --mca btl_tcp_if_include lo
       --mca oob_tcp_if_include lo -np 2)
  for c in none bf16; do
    timeout 300 "${mpi[@]}" "$train" "${common[@]}" --backend mpi --compression "$c" \
      --json "$work/mpi-$c.json" >"$work/mpi-$c.out" 2>&1 ||
      { cat "$work/mpi-$c.out"; fail "mpi $c run failed"; }
  done
  python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
r0, r1 = (json.load(open(f"{work}/mpi-{c}.json")) for c in ("none", "bf16"))
assert r1["settings"]["compression"] == "bf16", r1["settings"]
l0, l1 = r0["results"]["final_loss"], r1["results"]["final_loss"]
assert l1 != l0 and abs(l1 - l0) / abs(l0) < 0.02, (l0, l1)
b0, b1 = r0["results"]["comm_bytes_per_step"], r1["results"]["comm_bytes_per_step"]
assert 0.45 < b1 / b0 < 0.55, f"mpi bf16: {b1} bytes a step against float32's {b0}"
print(f"OK: mpi bf16 loss {l1:.6f} against {l0:.6f}, {b1:.0f} bytes a step against {b0:.0f}")
PY
else
  echo "(no mpirun or no MPI in this build: the MPI backend's compression is not run here)"
fi

set +e
"$train" --model tiny-cnn --compute onednn --num-batches 1 --compression fp8 >"$work/bad.out" 2>&1
rc=$?
set -e
[[ $rc -eq 2 ]] || { cat "$work/bad.out"; fail "--compression fp8 exited $rc, not 2"; }
grep -q "compression 'fp8' is unknown: allowed are none, fp16, bf16" "$work/bad.out" ||
  { cat "$work/bad.out"; fail "the refusal does not name the allowed values"; }
echo "PASS"
